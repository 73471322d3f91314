"""Continuing runs as a user would: init_from applies this config's optimizer settings and model fields
that may change (and refuses, by name, those that cannot); a padded vocabulary resumes and is
init_from-ed; the fp8 recipe section is validated and used; a longer resumed run must say
`schedule.extend: true`; CMA's averaging window stays inside the held-rate tail; activation
checkpointing changes no loss."""

import json
from pathlib import Path

import pytest
import torch

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.train import Dist, build, resolve_start, train
from trainer.variants import phase2_config

from .conftest import run_config


def records(run_dir, kind="train"):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def phase1(shard_sets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("p1")
    cfg = run_config(run_dir, shard_sets, **{"train.steps": 4, "eval.every_steps": 0, "data.eval": None,
                                             "model.overrides.rope_theta": 10000.0})
    train(load_run_config(None, data=cfg))
    return run_dir


def _phase2(shard_sets, run_dir, phase1, **over):
    cfg = run_config(run_dir, shard_sets, **{"data.train": shard_sets["curriculum"], "data.eval": None,
                                             "train.steps": 2, "model.overrides.rope_theta": 10000.0,
                                             "schedule": {"kind": "linear", "lr_start": "init", "lr_end": 0.0},
                                             "init_from": {"path": str(phase1), "load_optimizer": True}, **over})
    return load_run_config(None, data=cfg)


def test_init_from_applies_this_configs_optimizer_settings(shard_sets, phase1, tmp_path):
    cfg = _phase2(shard_sets, tmp_path / "p2", phase1, **{"optim.matrix_lr_mult": 5.0, "optim.momentum": 0.8,
                                                          "optim.adam_weight_decay": 0.0})
    train(cfg)
    rec = records(tmp_path / "p2")
    assert all(r["lr"]["muonh/q_proj"] == pytest.approx(5 * r["lr_base"]) for r in rec)
    state = ckpt.load_optimizer_state(ckpt.resolve_checkpoint(tmp_path / "p2"))
    assert {g["momentum"] for g in state["matrix"]["param_groups"]} == {0.8}
    assert {g["lr_mult"] for g in state["matrix"]["param_groups"]} == {5.0}
    assert {g["weight_decay"] for g in state["adamw"]["param_groups"]} == {0.0}
    # the state tensors did come along: MuonH radii (and momenta) are phase 1's
    o1 = ckpt.load_optimizer_state(ckpt.resolve_checkpoint(phase1))["matrix"]["state"]
    assert all(torch.equal(o1[k]["radius"], state["matrix"]["state"][k]["radius"]) for k in o1)


def test_init_from_refuses_shape_changes_by_name_and_applies_rope_theta(shard_sets, phase1, tmp_path):
    bad = _phase2(shard_sets, tmp_path / "bad", phase1, **{"model.overrides.d_ff": 128})
    with pytest.raises(ValueError, match=r"model\.d_ff: checkpoint 64, config 128"):
        train(bad)
    cfg = _phase2(shard_sets, tmp_path / "rope", phase1, **{"model.overrides.rope_theta": 50000.0})
    start = resolve_start(cfg, tmp_path / "rope" / "checkpoints")
    built = build(cfg, start, Dist("cpu"), "fp32", 256, 32)
    assert built.model_cfg.rope_theta == 50000.0
    assert ckpt.read_state(ckpt.resolve_checkpoint(phase1)).model["rope_theta"] == 10000.0


def test_padded_vocabulary_resumes_and_is_init_from(shard_sets, tmp_path):
    over = {"train.steps": 2, "data.eval": None, "model.vocab_multiple": 96,
            "schedule": {"kind": "constant", "lr": 1e-3}, "checkpoint": {"every_steps": 2}}
    cfg = run_config(tmp_path / "pad", shard_sets, **over)
    train(load_run_config(None, data=cfg))
    st = ckpt.read_state(ckpt.resolve_checkpoint(tmp_path / "pad"))
    assert st.model["vocab_size"] == 288                         # 256 rounded up to a multiple of 96
    longer = dict(cfg, train={**cfg["train"], "steps": 4})
    train(load_run_config(None, data=longer))                      # resumes (a constant rate: no re-shape)
    assert [r["step"] for r in records(tmp_path / "pad")] == [1, 2, 3, 4]
    p2 = run_config(tmp_path / "p2", shard_sets, **{**over, "init_from": {"path": str(tmp_path / "pad")}})
    train(load_run_config(None, data=p2))
    assert ckpt.read_state(ckpt.resolve_checkpoint(tmp_path / "p2")).model["vocab_size"] == 288
    small = run_config(tmp_path / "small", shard_sets, **{**over, "model.overrides.vocab_size": 200})
    with pytest.raises(Exception, match="vocab"):
        train(load_run_config(None, data=small))


def test_fp8_section_is_validated_and_reaches_the_linears(shard_sets, tmp_path):
    from trainer.fp8 import Fp8Linear

    base = run_config(tmp_path / "fp8", shard_sets, **{"precision": "fp8-blockwise", "data.eval": None,
                                                       "model.overrides.d_model": 128, "model.overrides.d_ff": 128,
                                                       "model.overrides.head_dim": 64,
                                                       "fp8": {"scale_format": "fp32", "backend": "emulate"}})
    cfg = load_run_config(None, data=base)
    assert cfg.fp8.scale_format == "fp32"
    built = build(cfg, resolve_start(cfg, tmp_path / "fp8" / "checkpoints"), Dist("cpu"), "fp8-blockwise", 256, 32)
    fp8 = [m for m in built.model.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) == 14 and {m.scale_format for m in fp8} == {"fp32"} and {m.backend_pref for m in fp8} == {"emulate"}
    with pytest.raises(ContractError, match="fp8.scale_format"):
        load_run_config(None, data={**base, "fp8": {"scale_format": "e8m0"}})
    with pytest.raises(ContractError, match="precision"):
        load_run_config(None, data={**base, "precision": "bf16"})


def test_a_longer_resumed_run_must_say_schedule_extend(shard_sets, tmp_path):
    sched = {"kind": "wsd", "lr": 2e-3, "warmup_steps": 1, "decay_ratio": 0.5}
    cfg = run_config(tmp_path / "run", shard_sets, **{"train.steps": 4, "data.eval": None, "schedule": sched})
    train(load_run_config(None, data=cfg))
    longer = dict(cfg, train={**cfg["train"], "steps": 6})
    with pytest.raises(ValueError, match="schedule.extend: true"):
        train(load_run_config(None, data=longer))
    train(load_run_config(None, data=dict(longer, schedule={**sched, "extend": True})))
    rec = records(tmp_path / "run")
    assert [r["step"] for r in rec] == [1, 2, 3, 4, 5, 6]
    assert rec[3]["lr_base"] == 0.0 and rec[4]["lr_base"] > 0      # the extension re-shaped the decay


def test_cma_window_must_stay_in_the_held_tail(shard_sets, tmp_path):
    kw = dict(base=run_config("x", shard_sets, **{"schedule": {"kind": "linear", "lr_start": "init"}}),
              phase1_checkpoint=str(tmp_path), phase1_step=6, uniform=shard_sets["uniform"],
              curriculum=shard_sets["curriculum"], run_dir=str(tmp_path / "cma"), decay_steps=8, resume_step=4)
    with pytest.raises(ValueError, match="reach back into the decay"):
        phase2_config("CMA", continue_steps=3, average_n=3, average_spacing=2, **kw)
    assert phase2_config("CMA", continue_steps=4, average_n=3, average_spacing=2, **kw).average.n == 3


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_changes_no_loss(shard_sets, tmp_path, mode):
    over = {"train.steps": 2, "data.eval": None, "checkpoint": {"every_steps": 0, "at_end": False}}
    train(load_run_config(None, data=run_config(tmp_path / "none", shard_sets, **over)))
    train(load_run_config(None, data=run_config(tmp_path / mode, shard_sets,
                                                **{**over, "parallel.activation_checkpointing": mode})))
    a, b = records(tmp_path / "none"), records(tmp_path / mode)
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-6)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a], rel=1e-5)
