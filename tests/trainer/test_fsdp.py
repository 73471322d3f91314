"""FSDP2 on CPU: 2 gloo processes with `parallel.data: fsdp` match 1 process at the same global batch
(losses, gradient norms, final weights), write the same full checkpoint files a single process
writes, and resume from them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.train import train

from .conftest import run_config

REPO = Path(__file__).resolve().parents[2]


def records(run_dir):
    return [r for r in map(json.loads, (Path(run_dir) / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def torchrun(conf: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2",
                           "-m", "trainer", "train", "--config", str(conf)], env=env, capture_output=True, text=True,
                          timeout=280)


@pytest.mark.timeout(400)
def test_two_fsdp_processes_match_one_process_and_resume(shard_sets, tmp_path):
    one = run_config(tmp_path / "one", shard_sets, **{"train.steps": 4, "train.micro_batch": 1, "data.eval": None,
                                                      "checkpoint": {"every_steps": 2, "keep_last": 3}})
    train(load_run_config(None, data=one))
    two = dict(one, run_dir=str(tmp_path / "two"), parallel={"data": "fsdp"},
               train={"steps": 2, "global_batch": 4, "micro_batch": 1})
    conf = tmp_path / "two.yaml"
    conf.write_text(yaml.safe_dump(two))
    out = torchrun(conf)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 rank(s) (fsdp)" in out.stderr
    conf.write_text(yaml.safe_dump(dict(two, train={**two["train"], "steps": 4})))   # resume the FSDP run
    out = torchrun(conf)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stderr
    r1, r2 = records(tmp_path / "one"), records(tmp_path / "two")
    assert [r["step"] for r in r2] == [1, 2, 3, 4]
    for a, b in zip(r1, r2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    w1 = ckpt.load_weights(tmp_path / "one" / "checkpoints" / ckpt.step_dir_name(4))
    w2 = ckpt.load_weights(tmp_path / "two" / "checkpoints" / ckpt.step_dir_name(4))
    assert set(w1) == set(w2)
    for k in w1:
        assert w2[k].shape == w1[k].shape
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)
    o2 = ckpt.load_optimizer_state(tmp_path / "two" / "checkpoints" / ckpt.step_dir_name(4))
    o1 = ckpt.load_optimizer_state(tmp_path / "one" / "checkpoints" / ckpt.step_dir_name(4))
    assert o2["adamw"]["state"][0]["exp_avg"].shape == o1["adamw"]["state"][0]["exp_avg"].shape
