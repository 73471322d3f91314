"""Phase-2 variants (behaviour 29): UD, CD, CDC and CMA differ only in stream order, LR tail and
averaging, all from the same phase-1 checkpoint; a CMA run follows CD's decay, holds the rate at
schedule(resume_step), and ends with the average of its last checkpoints, evaluated."""

import json
from pathlib import Path

import pytest
import torch

from trainer import checkpoint as ckpt
from trainer.average import average_state_dicts
from trainer.config import load_run_config
from trainer.schedules import lr_at
from trainer.train import train
from trainer.variants import VARIANTS, phase2_config, phase2_configs

from .conftest import run_config


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _base(shard_sets):
    cfg = run_config("unused", shard_sets, **{"checkpoint": {"every_steps": 2, "keep_last": 2},
                                              "schedule": {"kind": "linear", "lr_start": "init", "lr_end": 0.0}})
    for k in ("run_dir",):
        cfg.pop(k)
    cfg["data"].pop("train")
    return cfg


@pytest.fixture(scope="module")
def phase1(shard_sets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("phase1")
    cfg = run_config(run_dir, shard_sets, **{"train.steps": 6, "eval.every_steps": 0,
                                             "schedule": {"kind": "constant", "lr": 2e-3, "warmup_steps": 2}})
    train(load_run_config(None, data=cfg))
    return run_dir


def test_variants_differ_only_in_order_tail_and_averaging(shard_sets, phase1, tmp_path):
    configs = phase2_configs(base=_base(shard_sets), phase1_checkpoint=str(phase1), phase1_step=6,
                             uniform=shard_sets["uniform"], curriculum=shard_sets["curriculum"],
                             run_dir=str(tmp_path), decay_steps=8, resume_step=6, continue_steps=4,
                             average_n=3, average_spacing=2)
    assert list(configs) == list(VARIANTS)
    flat = {v: _flat(c.dump()) for v, c in configs.items()}
    allowed = {"run_dir", "notes.variant", "data.train", "schedule.hold_from_step", "schedule.horizon_steps",
               "train.steps", "average", "average.n", "average.spacing", "average.dtype"}
    for a in VARIANTS:
        for b in VARIANTS:
            diff = {k for k in set(flat[a]) | set(flat[b]) if flat[a].get(k) != flat[b].get(k)}
            assert diff <= allowed, (a, b, diff - allowed)
    assert {c.init_from.path for c in configs.values()} == {str(phase1)}       # the same phase-1 checkpoint
    assert all(c.init_from.load_optimizer and not c.init_from.continue_data for c in configs.values())
    assert configs["UD"].data.train == shard_sets["uniform"]
    assert {configs[v].data.train for v in ("CD", "CDC", "CMA")} == {shard_sets["curriculum"]}
    assert configs["UD"].schedule == configs["CD"].schedule                    # same decay
    assert configs["CDC"].schedule.hold_from_step == 12 and configs["CDC"].schedule.horizon_steps == 8
    assert configs["CDC"].average is None and configs["CMA"].average.n == 3
    with pytest.raises(ValueError, match="resume_step"):
        phase2_config("CMA", base=_base(shard_sets), phase1_checkpoint=str(phase1), phase1_step=6,
                      uniform="u", curriculum="c", run_dir="r", decay_steps=8)


def test_cma_run_holds_the_rate_and_averages_its_last_checkpoints(shard_sets, phase1, tmp_path):
    cfg = phase2_config("CMA", base=_base(shard_sets), phase1_checkpoint=str(phase1), phase1_step=6,
                        uniform=shard_sets["uniform"], curriculum=shard_sets["curriculum"],
                        run_dir=str(tmp_path / "cma"), decay_steps=8, resume_step=4, continue_steps=6,
                        average_n=3, average_spacing=2)
    summary = train(cfg)
    recs = [json.loads(l) for l in (tmp_path / "cma" / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train_recs] == list(range(7, 17))
    p1_next = ckpt.read_state(ckpt.resolve_checkpoint(phase1)).schedule.lr_base_next
    cd = cfg.schedule.model_copy(update={"hold_from_step": None, "horizon_steps": None, "lr_start": p1_next})
    cd_lr = lambda s: lr_at(cd, s, total_steps=6 + 8, tokens_per_step=128, start_step=6)  # noqa: E731
    lrs = {r["step"]: r["lr_base"] for r in train_recs}                       # step k used lr(k - 1)
    assert lrs[7] == pytest.approx(p1_next)
    for step in (8, 9, 10):
        assert lrs[step] == pytest.approx(cd_lr(step - 1))                      # CD's decay ...
    for step in range(11, 17):
        assert lrs[step] == pytest.approx(cd_lr(10))                          # ... held at schedule(resume_step)
    assert 0 < cd_lr(10) < p1_next
    avg_dir = Path(summary["average"])
    st = ckpt.read_state(avg_dir)
    assert [s["step"] for s in st.sources] == [12, 14, 16] and st.kind == "average"
    expect = average_state_dicts([ckpt.load_weights(tmp_path / "cma" / "checkpoints" / ckpt.step_dir_name(s))
                                  for s in (12, 14, 16)])
    got = ckpt.load_weights(avg_dir)
    assert all(torch.equal(got[k], expect[k]) for k in expect)
    avg_eval = [r for r in recs if r["kind"] == "eval" and r.get("model") == "average"]
    assert len(avg_eval) == 1 and avg_eval[0]["eval_loss"] == summary["average_eval_loss"]
    evals = [r["eval_loss"] for r in recs if r["kind"] == "eval" and "model" not in r]
    assert evals[-1] < evals[0]                                                # phase 2 did train
    again = train(cfg)                                                         # a finished run started again
    assert again["average_eval_loss"] == summary["average_eval_loss"] and again["eval_loss"] == summary["eval_loss"]
    assert (tmp_path / "cma" / "metrics.jsonl").read_text().splitlines() == [json.dumps(r, sort_keys=True) for r in recs]
