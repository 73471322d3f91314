"""Issue 21 (checkpoints): every tensor file is checked against the sha256 in state.json; a damaged
latest checkpoint is reported by path and the previous complete one is used; a resume that would
change the model or the data order is refused unless allowed by name."""

import logging
import shutil
import struct

import pytest
import torch

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.model import ModelConfig
from trainer.train import train

from .conftest import run_config

MODEL = ModelConfig(vocab_size=11, d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, d_ff=6).model_dump()


def _save(root, step):
    g = torch.Generator().manual_seed(step)
    w = {"a.weight": torch.randn(64, 64, generator=g), "b.weight": torch.randn(5, generator=g)}
    opt = {"state": {0: {"momentum_buffer": torch.ones(256)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    st = ckpt.CheckpointState(step=step, tokens_seen=step, model=MODEL, config={"seed": 0, "train": {"steps": 9}})
    return ckpt.save_checkpoint(root / ckpt.step_dir_name(step), w, opt, st)


def _flip_exponent(path):
    """Flip the top exponent bit of the first float32 in a safetensors file (x -> ~x * 2^128)."""
    data = bytearray(path.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    data[8 + header_len + 3] ^= 0x40
    path.write_bytes(bytes(data))


def test_state_records_the_sha256_of_every_tensor_file(tmp_path):
    d = _save(tmp_path, 3)
    st = ckpt.read_state(d)
    assert set(st.files) == {ckpt.WEIGHTS, ckpt.OPTIMIZER}
    assert ckpt.verify_checkpoint(d).step == 3


@pytest.mark.parametrize("damage", ["exponent", "header", "truncated_optimizer", "missing_optimizer"])
def test_damaged_files_are_named_and_refused(tmp_path, damage):
    d = _save(tmp_path, 3)
    if damage == "exponent":
        _flip_exponent(d / ckpt.WEIGHTS)
    elif damage == "header":
        data = bytearray((d / ckpt.WEIGHTS).read_bytes())
        data[12] ^= 0xFF
        (d / ckpt.WEIGHTS).write_bytes(bytes(data))
    elif damage == "truncated_optimizer":
        (d / ckpt.OPTIMIZER).write_bytes((d / ckpt.OPTIMIZER).read_bytes()[:100])
    else:
        (d / ckpt.OPTIMIZER).unlink()
    name = ckpt.OPTIMIZER if "optimizer" in damage else ckpt.WEIGHTS
    with pytest.raises(ContractError, match=rf"{d.name}/{name}"):
        ckpt.verify_checkpoint(d)
    if damage != "missing_optimizer":
        load = ckpt.load_optimizer_state if name == ckpt.OPTIMIZER else ckpt.load_weights
        with pytest.raises(ContractError, match=rf"{d.name}/{name}: sha256 .* does not match"):
            load(d)


def test_resume_point_falls_back_to_the_previous_complete_checkpoint(tmp_path, caplog):
    for step in (2, 4, 6):
        _save(tmp_path, step)
    _flip_exponent(tmp_path / ckpt.step_dir_name(6) / ckpt.WEIGHTS)
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        d, st = ckpt.resume_point(tmp_path, {"seed": 0, "train": {"steps": 9}})
    assert st.step == 4 and d.name == ckpt.step_dir_name(4)
    assert any(ckpt.step_dir_name(6) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 4]
    assert (tmp_path / (ckpt.step_dir_name(6) + ckpt.DAMAGED_SUFFIX)).is_dir()       # kept, not deleted
    for step in (2, 4):
        (tmp_path / ckpt.step_dir_name(step) / ckpt.OPTIMIZER).write_bytes(b"junk")
    with pytest.raises(ContractError, match="every checkpoint is damaged"):
        ckpt.resume_point(tmp_path, {"seed": 0})


@pytest.mark.parametrize("key,saved,current", [
    ("model.overrides.d_model", {"model": {"overrides": {"d_model": 32}}}, {"model": {"overrides": {"d_model": 64}}}),
    ("precision", {"precision": "fp32"}, {"precision": "bf16"}),
    ("train.global_batch", {"train": {"global_batch": 4, "steps": 8}}, {"train": {"global_batch": 8, "steps": 8}}),
    ("seed", {"seed": 0}, {"seed": 1}),
    ("data.seq_len", {"data": {"seq_len": 32}}, {"data": {"seq_len": 64}}),
])
def test_resume_refuses_changes_of_the_model_or_data_order(key, saved, current):
    with pytest.raises(ContractError, match=r"--allow-config-change " + key.split(".")[-1]) as e:
        ckpt.check_resume_config(saved, current)
    assert e.value.field == key
    # allowed by its last name or its full path: goes on, and the change is reported
    assert ckpt.check_resume_config(saved, current, allow=[key.split(".")[-1]]) == [key]
    assert ckpt.check_resume_config(saved, current, allow=[key]) == [key]


def test_free_keys_change_without_a_word_and_others_are_reported():
    saved = {"train": {"steps": 8, "global_batch": 4}, "log": {"every_steps": 1}, "optim": {"lr": 1}}
    current = {"train": {"steps": 16, "global_batch": 4}, "log": {"every_steps": 5}, "optim": {"lr": 2}}
    assert ckpt.check_resume_config(saved, current) == ["optim.lr"]


@pytest.mark.timeout(300)
def test_training_resumes_from_the_checkpoint_before_a_damaged_one(shard_sets, tmp_path):
    cfg = run_config(tmp_path / "run", shard_sets, **{"checkpoint.keep_last": 3})
    train(load_run_config(None, data=cfg))
    root = tmp_path / "run" / "checkpoints"
    last = root / ckpt.step_dir_name(8)
    reference = (last / ckpt.WEIGHTS).read_bytes()
    _flip_exponent(last / ckpt.WEIGHTS)
    summary = train(load_run_config(None, data=cfg))               # resumes from step 6, redoes 7 and 8
    assert summary["step"] == 8
    assert (last / ckpt.WEIGHTS).read_bytes() == reference         # the same weights as before the damage
    assert (root / (last.name + ckpt.DAMAGED_SUFFIX)).is_dir()
    with pytest.raises(ContractError, match="--allow-config-change seed"):
        train(load_run_config(None, data=dict(cfg, seed=1)))
    assert train(load_run_config(None, data=dict(cfg, seed=1)), allow_config_change=("seed",))["step"] == 8
    shutil.rmtree(root / (last.name + ckpt.DAMAGED_SUFFIX))
