"""The training loop end to end on shard sets read through the mixtures reader: held-out loss goes
down; SIGKILL at a random step and resume gives exactly the uninterrupted trajectory; 2 DDP
processes match 1 process at the same global batch; SFT counts only masked tokens; phase 2
continues a phase-1 checkpoint; the CMA average is built and evaluated."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.model import build_model, token_losses
from trainer.train import train

from .conftest import run_config

REPO = Path(__file__).resolve().parents[2]


def records(run_dir, kind="train"):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def cli_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def write_yaml(path, cfg) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_tiny_run_on_shards_decreases_held_out_loss(shard_sets, tmp_path):
    cfg = run_config(tmp_path / "run", shard_sets, **{"train.steps": 30, "eval.every_steps": 15,
                                                      "schedule": {"kind": "wsd", "lr": 3e-3, "warmup_steps": 3,
                                                                   "decay_ratio": 0.3}})
    summary = train(load_run_config(None, data=cfg))
    evals = records(tmp_path / "run", "eval")
    assert [e["step"] for e in evals] == [0, 15, 30]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.3
    assert summary["eval_loss"] == evals[-1]["eval_loss"]
    rec = records(tmp_path / "run")
    assert [r["step"] for r in rec] == list(range(1, 31))
    assert rec[-1]["tokens_seen"] == 30 * 4 * 32
    last = rec[-1]
    assert set(last["zero_grad_frac"]) == {"embed", "layers.0", "layers.1", "norm", "lm_head"}
    assert 0 < last["zero_grad_frac"]["embed"] < 1          # unseen tokens' embedding rows get exactly zero
    for name, rho in last["effective_lr"].items():
        assert rho == pytest.approx(last["lr"][name], rel=1e-5)   # measured rho equals the MuonH rate
    assert all(r["lr"]["muonh/q_proj"] == pytest.approx(10 * r["lr_base"]) for r in rec)
    assert last["tokens_per_s"] > 0 and last["grad_norm"] > 0
    # retention: the last 2 checkpoints
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")] == [28, 30]


@pytest.mark.timeout(300)
def test_sigkill_at_a_random_step_then_resume_is_exact(shard_sets, tmp_path):
    """A real subprocess is SIGKILLed at a seeded random step (possibly mid-checkpoint); rerunning
    the same command resumes and the loss trajectory, eval losses and final weights are bit-identical
    to an uninterrupted run."""
    base = run_config(tmp_path / "ref", shard_sets, **{"train.steps": 12, "checkpoint.every_steps": 1,
                                                       "checkpoint.keep_last": 2, "eval.every_steps": 5})
    train(load_run_config(None, data=base))                      # the uninterrupted reference
    kill_after = random.Random(20251130).randint(3, 9)
    cfg = dict(base, run_dir=str(tmp_path / "killed"))
    conf = write_yaml(tmp_path / "killed.yaml", cfg)
    cmd = [sys.executable, "-m", "trainer", "train", "--config", str(conf)]
    proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(json.loads(l).get("step", 0) >= kill_after and json.loads(l)["kind"] == "train"
                                    for l in metrics.read_text().splitlines() if l.endswith("}")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before step {kill_after}: {proc.stderr.read().decode()[-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [s for s, _ in ckpt.list_checkpoints(tmp_path / "killed" / "checkpoints")]
    assert done and max(done) < 12, done
    out = subprocess.run(cmd, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stderr
    ref, got = records(tmp_path / "ref"), records(tmp_path / "killed")
    assert [r["step"] for r in got] == list(range(1, 13))
    assert [r["loss"] for r in got] == [r["loss"] for r in ref], f"killed after step {kill_after}"
    assert [r["grad_norm"] for r in got] == [r["grad_norm"] for r in ref]
    assert [(r["step"], r["eval_loss"]) for r in records(tmp_path / "killed", "eval")] == \
           [(r["step"], r["eval_loss"]) for r in records(tmp_path / "ref", "eval")]
    a = (tmp_path / "ref" / "checkpoints" / ckpt.step_dir_name(12) / ckpt.WEIGHTS).read_bytes()
    b = (tmp_path / "killed" / "checkpoints" / ckpt.step_dir_name(12) / ckpt.WEIGHTS).read_bytes()
    assert a == b
    st = ckpt.read_state(tmp_path / "killed" / "checkpoints" / ckpt.step_dir_name(12))
    assert st.data_cursor["token_offset"] == 12 * 4 * 32 and st.tokens_seen == 12 * 4 * 32


@pytest.mark.timeout(300)
def test_two_ddp_processes_match_one_process(shard_sets, tmp_path):
    one = run_config(tmp_path / "one", shard_sets, **{"train.steps": 5, "train.micro_batch": 2})
    train(load_run_config(None, data=one))
    two = dict(one, run_dir=str(tmp_path / "two"), train={"steps": 5, "global_batch": 4, "micro_batch": 1})
    conf = write_yaml(tmp_path / "two.yaml", two)
    torchrun = Path(sys.executable).parent / "torchrun"
    out = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "trainer", "train",
                          "--config", str(conf)], env=cli_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 rank(s)" in out.stderr
    r1, r2 = records(tmp_path / "one"), records(tmp_path / "two")
    assert len(r1) == len(r2) == 5
    for a, b in zip(r1, r2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        assert b["tokens_seen"] == a["tokens_seen"]
    e1, e2 = records(tmp_path / "one", "eval"), records(tmp_path / "two", "eval")
    assert e2[-1]["eval_loss"] == pytest.approx(e1[-1]["eval_loss"], rel=1e-5)
    w1 = ckpt.load_weights(tmp_path / "one" / "checkpoints" / ckpt.step_dir_name(5))
    w2 = ckpt.load_weights(tmp_path / "two" / "checkpoints" / ckpt.step_dir_name(5))
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5)


def test_sft_loss_counts_only_masked_tokens(shard_sets, tmp_path):
    """With a zero learning rate the first step's loss is the initial model's mean loss over the
    assistant (masked) targets of that batch, computed here independently."""
    from mixtures import ShardReader

    cfg = run_config(tmp_path / "sft", shard_sets, **{"objective": "sft", "data.train": shard_sets["sft"],
                                                      "data.eval": None, "train.steps": 2,
                                                      "schedule": {"kind": "constant", "lr": 0.0}})
    config = load_run_config(None, data=cfg)
    train(config)
    batch = next(ShardReader(shard_sets["sft"], global_batch_size=4))
    mask = torch.from_numpy(batch["loss_mask"]).float()
    assert 0 < mask.sum() < mask.numel()
    model = build_model(config.model.build(256, 32), seed=0)
    with torch.no_grad():
        losses = token_losses(model(torch.from_numpy(batch["input_ids"])), torch.from_numpy(batch["labels"]))
    expect = float((losses * mask).sum() / mask.sum())
    first = records(tmp_path / "sft")[0]
    assert first["loss_tokens"] == int(mask.sum())
    assert first["loss"] == pytest.approx(expect, rel=1e-5)
    with pytest.raises(ContractError, match="sft"):
        train(load_run_config(None, data=dict(cfg, run_dir=str(tmp_path / "bad"),
                                              data={"train": shard_sets["train"]})))


def test_phase2_continues_the_phase1_checkpoint(shard_sets, tmp_path):
    p1 = run_config(tmp_path / "p1", shard_sets, **{"train.steps": 6, "schedule": {
        "kind": "power", "a": 4.0, "b": -0.51, "lr_max": 3e-3, "batch_size": 40, "warmup_steps": 2}})
    train(load_run_config(None, data=p1))
    p1_state = ckpt.read_state(ckpt.resolve_checkpoint(tmp_path / "p1"))
    p2 = run_config(tmp_path / "p2", shard_sets, **{
        "data.train": shard_sets["curriculum"], "train.steps": 4,
        "schedule": {"kind": "linear", "lr_start": "init", "lr_end": 0.0},
        "init_from": {"path": str(tmp_path / "p1"), "load_optimizer": True}})
    train(load_run_config(None, data=p2))
    rec = records(tmp_path / "p2")
    assert [r["step"] for r in rec] == [7, 8, 9, 10]                       # one global step counter
    assert rec[0]["lr_base"] == p1_state.schedule.lr_base_next              # no jump at the boundary
    assert rec[-1]["lr_base"] == 0.0
    assert rec[0]["tokens_seen"] == p1_state.tokens_seen + 4 * 32
    st = ckpt.read_state(ckpt.resolve_checkpoint(tmp_path / "p2"))
    assert st.data_cursor["token_offset"] == 4 * 4 * 32                     # phase-2 data restarted at 0
    assert st.run_start_step == 6
    # the optimizer state came along: the MuonH radii are phase 1's
    o1 = ckpt.load_optimizer_state(ckpt.resolve_checkpoint(tmp_path / "p1"))["matrix"]["state"]
    o2 = ckpt.load_optimizer_state(ckpt.resolve_checkpoint(tmp_path / "p2"))["matrix"]["state"]
    assert all(torch.equal(o1[k]["radius"], o2[k]["radius"]) for k in o1)


def test_config_errors_name_the_field(shard_sets, tmp_path):
    with pytest.raises(ContractError, match="field 'train.stepz'"):
        load_run_config(None, data=run_config(tmp_path, shard_sets, **{"train.stepz": 3}))
    with pytest.raises(ContractError, match="average.spacing"):
        load_run_config(None, data=run_config(tmp_path, shard_sets, **{"average": {"n": 2, "spacing": 3}}))
    with pytest.raises(ContractError, match="unknown preset"):
        load_run_config(None, data=run_config(tmp_path, shard_sets, **{"model.preset": "huge"}))
    with pytest.raises(ContractError, match="init_from.path"):
        load_run_config(None, data=dict(run_config(tmp_path, shard_sets), extends="sft-puro"))
    cfg = run_config(tmp_path / "long", shard_sets, **{"train.steps": 10_000})
    with pytest.raises(ValueError, match="global batches"):
        train(load_run_config(None, data=cfg))


def test_tensorboard_holds_every_numeric_metric_of_the_jsonl_at_its_step(shard_sets, tmp_path):
    """`log.tensorboard: true` writes each numeric field of each metrics record (nested ones as `a/b`) as a
    scalar at the record's step; read back with TensorBoard's own reader. tensorboard is a test dependency."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = run_config(tmp_path / "tb", shard_sets, **{"train.steps": 3, "eval.every_steps": 3, "log.tensorboard": True})
    train(load_run_config(None, data=cfg))
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    train_recs = records(tmp_path / "tb")
    assert [e.step for e in events.Scalars("loss")] == [r["step"] for r in train_recs] == [1, 2, 3]
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([r["loss"] for r in train_recs])  # float32
    assert [e.step for e in events.Scalars("eval_loss")] == [r["step"] for r in records(tmp_path / "tb", "eval")]
    nested = next(k for k, v in train_recs[-1].items() if isinstance(v, dict))
    assert any(tag.startswith(nested + "/") for tag in events.Tags()["scalars"])


def test_tensorboard_asked_for_but_not_installed_stops_with_the_extra_to_install(shard_sets, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)       # import fails as if absent
    cfg = run_config(tmp_path / "tb", shard_sets, **{"train.steps": 2, "log.tensorboard": True})
    with pytest.raises(RuntimeError, match=r"purokit\[tensorboard\]"):
        train(load_run_config(None, data=cfg))


def test_a_non_finite_loss_stops_before_any_checkpoint_after_it(shard_sets, tmp_path, monkeypatch):
    """The loop reads each step's loss one step late (after the next step is queued); a NaN in step 4
    is read while step 5 runs and stops the run naming step 4, with steps 1-3 recorded and no
    checkpoint from step 4 on (the step-6 checkpoint is never written)."""
    import trainer.step as loop

    calls = {"n": 0}
    real = loop.micro_loss_sum

    def poisoned(loss_model, mb):
        calls["n"] += 1
        s = real(loss_model, mb)
        return s * float("nan") if calls["n"] == 4 else s     # one micro-batch a step: step 4's

    monkeypatch.setattr(loop, "micro_loss_sum", poisoned)
    cfg = run_config(tmp_path / "run", shard_sets, **{"train.steps": 8, "train.micro_batch": 4,
                                                      "checkpoint.every_steps": 3, "checkpoint.keep_last": 10,
                                                      "eval.every_steps": 0})
    with pytest.raises(FloatingPointError, match="at step 4;"):
        train(load_run_config(None, data=cfg))
    assert [r["step"] for r in records(tmp_path / "run")] == [1, 2, 3]
    assert calls["n"] == 5                                   # step 5 was queued before step 4 was read
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")] == [3]


def test_host_numbers_are_summed_over_gloo_beside_a_device_backend(tmp_path, monkeypatch):
    """Under a device backend (NCCL on GPU; here gloo named per device type, which is not plain "gloo")
    the loop's host numbers go through a gloo group of their own, on CPU tensors."""
    import torch.distributed as dist

    from trainer.train import Dist

    monkeypatch.setenv("WORLD_SIZE", "2")          # what a 2-rank run sees; the group itself has 1 rank here
    dist.init_process_group("cpu:gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        d = Dist("cpu")
        assert d.host_group is not None and dist.get_backend(d.host_group) == "gloo"
        assert d.all_reduce_sum([3.0, 0.5]) == [3.0, 0.5]
    finally:
        dist.destroy_process_group()
