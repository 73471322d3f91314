"""The checkpoint contract: atomic writes, validation on read, retention, RNG state; and CMA
averaging (behaviour 28)."""

import json
import random

import numpy as np
import pytest
import torch

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.__main__ import main as trainer_main
from trainer.average import average_checkpoints, average_last, average_state_dicts, select_for_average
from trainer.model import ModelConfig

MODEL = ModelConfig(vocab_size=11, d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, d_ff=6).model_dump()


def _state(step):
    return ckpt.CheckpointState(step=step, tokens_seen=step * 10, model=MODEL, data_cursor={"token_offset": step})


def _weights(seed):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(3, 4, generator=g), "b.weight": torch.randn(5, generator=g)}


def test_save_and_read_round_trip(tmp_path):
    w = _weights(0)
    opt = {"state": {0: {"momentum_buffer": torch.ones(3)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    d = ckpt.save_checkpoint(tmp_path / ckpt.step_dir_name(7), w, opt, _state(7))
    st = ckpt.read_state(d)
    assert st.step == 7 and st.tokens_seen == 70 and st.data_cursor == {"token_offset": 7}
    assert st.weights_dtype == "float32"
    got = ckpt.load_weights(d)
    assert all(torch.equal(got[k], w[k]) for k in w)
    assert torch.equal(ckpt.load_optimizer_state(d)["state"][0]["momentum_buffer"], torch.ones(3))
    assert ckpt.resolve_checkpoint(tmp_path) == d


def test_a_killed_writer_leaves_no_checkpoint(tmp_path, monkeypatch):
    ckpt.save_checkpoint(tmp_path / ckpt.step_dir_name(1), _weights(0), None, _state(1))

    def boom(*a, **k):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(ckpt.torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path / ckpt.step_dir_name(2), _weights(1), {"x": 1}, _state(2))
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]
    assert not (tmp_path / ckpt.step_dir_name(2)).exists()
    # debris of a SIGKILLed writer (a .tmp-* directory) is never listed as a checkpoint
    (tmp_path / ".tmp-step_00000003.abc").mkdir()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [1]


def test_state_validation_names_the_file_and_field(tmp_path):
    d = ckpt.save_checkpoint(tmp_path / "c", _weights(0), None, _state(1))
    raw = json.loads((d / "state.json").read_text())
    raw["schema"] = "trainer-checkpoint/0"
    (d / "state.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="schema"):
        ckpt.read_state(d)
    raw["schema"] = ckpt.CHECKPOINT_SCHEMA
    raw["step"] = "many"
    (d / "state.json").write_text(json.dumps(raw))
    with pytest.raises(ContractError, match="field 'step'") as e:
        ckpt.read_state(d)
    assert str(d / "state.json") in str(e.value)
    with pytest.raises(ContractError, match="no complete checkpoint"):
        ckpt.resolve_checkpoint(tmp_path / "nothing")


def test_retention_keeps_last_n_and_every_k(tmp_path):
    assert ckpt.retained_steps([10, 20, 30, 40, 50, 60], 2, 30) == {30, 50, 60}
    assert ckpt.retained_steps([10, 20, 30], 1, 0, protect={10}) == {10, 30}
    for s in (10, 20, 30, 40, 50, 60):
        ckpt.save_checkpoint(tmp_path / ckpt.step_dir_name(s), _weights(s), None, _state(s))
    assert ckpt.prune(tmp_path, keep_last=2, keep_every=30) == [10, 20, 40]
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [30, 50, 60]


def test_rng_state_round_trip():
    state = ckpt.capture_rng()
    a = (torch.rand(3), np.random.rand(2), random.random())
    ckpt.restore_rng(json.loads(json.dumps(state)))           # survives JSON
    b = (torch.rand(3), np.random.rand(2), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


# ---- averaging (CMA) ---------------------------------------------------------------------------

def test_select_last_n_spaced_by_100():
    with pytest.raises(ValueError, match="missing"):      # the newest (1250) is off the 100-step grid
        select_for_average(list(range(100, 1300, 100)) + [1250], 6, 100)
    assert select_for_average(list(range(100, 1300, 100)), 6, 100) == [700, 800, 900, 1000, 1100, 1200]
    with pytest.raises(ValueError, match="missing"):
        select_for_average([100, 200, 400, 500, 600, 700], 6, 100)
    assert select_for_average([5, 9, 12, 30], 3, 0) == [9, 12, 30]


def test_average_is_the_equal_weight_mean_in_bf16():
    states = [_weights(i) for i in range(6)]
    avg = average_state_dicts(states)
    for k in states[0]:
        expect = torch.stack([s[k].double() for s in states]).mean(0).to(torch.bfloat16)
        assert avg[k].dtype == torch.bfloat16
        assert torch.equal(avg[k], expect)


def test_averaging_identical_checkpoints_is_the_identity(tmp_path):
    w = _weights(3)
    dirs = [ckpt.save_checkpoint(tmp_path / "run" / ckpt.step_dir_name(100 * i), w, {"x": 1}, _state(100 * i))
            for i in range(1, 7)]
    out = average_last(tmp_path / "run", tmp_path / "avg", n=6, spacing=100)
    got = ckpt.load_weights(out)
    for k in w:
        assert torch.equal(got[k], w[k].to(torch.bfloat16))
    st = ckpt.read_state(out)
    assert st.kind == "average" and st.step == 600 and [s["step"] for s in st.sources] == [100, 200, 300, 400, 500, 600]
    assert not (out / ckpt.OPTIMIZER).exists() and st.weights_dtype == "bfloat16"
    fp32 = average_checkpoints(dirs, tmp_path / "avg32", dtype=torch.float32)
    assert all(torch.equal(ckpt.load_weights(fp32)[k], w[k]) for k in w)


def test_average_cli(tmp_path, capsys):
    for i in range(1, 4):
        ckpt.save_checkpoint(tmp_path / "c" / ckpt.step_dir_name(50 * i), _weights(i), None, _state(50 * i))
    assert trainer_main(["average", "--checkpoints", str(tmp_path / "c"), "--out", str(tmp_path / "avg"),
                         "--n", "3", "--spacing", "50"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [50, 100, 150]
    expect = average_state_dicts([_weights(i) for i in range(1, 4)])
    got = ckpt.load_weights(tmp_path / "avg")
    assert all(torch.equal(got[k], expect[k]) for k in expect)


def test_averaging_refuses_mismatched_models(tmp_path):
    a = ckpt.save_checkpoint(tmp_path / "a", _weights(0), None, _state(1))
    other = dict(MODEL, d_ff=8)
    b = ckpt.save_checkpoint(tmp_path / "b", _weights(1), None,
                             ckpt.CheckpointState(step=2, tokens_seen=0, model=other))
    with pytest.raises(ContractError, match="different model"):
        average_checkpoints([a, b], tmp_path / "out")
