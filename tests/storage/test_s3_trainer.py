"""The trainer against a real S3 endpoint (moto on loopback): shard sets read from s3 (staged into the
local cache, sha256-checked, then memory-mapped), checkpoints written to s3 through the commit
protocol, and a second run resuming from them."""

import hashlib
import json
import logging
import shutil

import pytest
import torch

from purokit import atomic, storage
from mixtures import write_token_lists
from tests.trainer.conftest import SEQ_LEN, VOCAB, run_config, synthetic_docs
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.data import EOS_SYNTHETIC
from trainer.train import train


def _s3_shard_sets(bucket: str) -> dict[str, str]:
    sets = {"train": f"{bucket}/shards/train", "heldout": f"{bucket}/shards/heldout"}
    write_token_lists(sets["train"], synthetic_docs(0, 120), seq_len=SEQ_LEN, vocab_size=VOCAB, eos_id=EOS_SYNTHETIC,
                      docs_per_shard=60)
    write_token_lists(sets["heldout"], synthetic_docs(10**6, 20), seq_len=SEQ_LEN, vocab_size=VOCAB,
                      eos_id=EOS_SYNTHETIC)
    return sets


def test_train_on_s3_shards_checkpointing_to_s3_then_resume(bucket, tmp_path):
    sets = _s3_shard_sets(bucket)
    run_dir = f"{bucket}/run"
    cfg = run_config(run_dir, sets, **{"train.steps": 6, "checkpoint.every_steps": 2, "checkpoint.keep_last": 2})
    summary = train(load_run_config(None, data=cfg))
    assert summary["step"] == 6 and summary["eval_loss"] is not None
    found = ckpt.list_checkpoints(f"{run_dir}/checkpoints")
    assert [s for s, _ in found] == [4, 6]                                   # pruned on s3 too
    assert all(storage.is_remote(p) for _, p in found)
    listing = [rel for rel, _, _ in storage.list_files(f"{run_dir}/checkpoints", hidden=True)]
    assert {rel.split("/")[0] for rel in listing} == {"step_00000004", "step_00000006"}
    assert len({rel.split("/")[1] for rel in listing if rel.split("/")[1].startswith("_attempt-")}) == 2
    state = ckpt.read_state(found[-1][1])
    assert state.step == 6 and state.data_cursor["token_offset"] == 6 * 4 * SEQ_LEN
    assert storage.exists(f"{run_dir}/summary.json")
    # the shard sets were staged locally and checked
    staged = storage.local_copy(sets["train"])
    assert staged.is_relative_to(storage.cache_root()) and (staged / "manifest.json").is_file()

    # the same run, longer, after a bit of step 6 flipped (its commit entry rewritten to match): resumes from step 4
    _damage(str(found[-1][1]), "flipped bit, entry rewritten")
    longer = run_config(run_dir, sets, **{"train.steps": 8, "checkpoint.every_steps": 2, "checkpoint.keep_last": 2,
                                          "schedule.extend": True})
    again = train(load_run_config(None, data=longer))
    assert again["step"] == 8
    assert storage.has_committed(f"{run_dir}/checkpoints/step_00000006{ckpt.DAMAGED_SUFFIX}", ckpt.STATE)
    assert [s for s, _ in ckpt.list_checkpoints(f"{run_dir}/checkpoints")] == [6, 8]
    assert ckpt.read_state(ckpt.latest_checkpoint(f"{run_dir}/checkpoints")).tokens_seen == 8 * 4 * SEQ_LEN


def _flip_bit(url: str) -> bytes:
    data = bytearray(storage.path(url).read_bytes())
    data[-1] ^= 0x01
    storage.write_bytes(url, bytes(data))
    return bytes(data)


def _damage(step_url: str, how: str) -> str:
    """Damage one object-store checkpoint; returns what the report must name."""
    record_url = f"{step_url}/{storage.COMMIT_NAME}"
    record = json.loads(storage.path(record_url).read_bytes())
    obj = f"{step_url}/{record['attempt']}"
    if how.startswith("flipped bit"):
        data = _flip_bit(f"{obj}/{ckpt.WEIGHTS}")
        if how.endswith("entry rewritten"):          # the commit record agrees, state.json does not
            entry = next(f for f in record["files"] if f["path"] == ckpt.WEIGHTS)
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            storage.write_bytes(record_url, json.dumps(record).encode())
            return f"{step_url}/{ckpt.WEIGHTS}"
        return f"{obj}/{ckpt.WEIGHTS}"
    if how == "deleted optimizer.pt":
        storage.remove_tree(f"{obj}/{ckpt.OPTIMIZER}")
        return f"{obj}/{ckpt.OPTIMIZER}"
    record["files"][0]["path"] = "../../../model.safetensors"     # a bad commit record
    storage.write_bytes(record_url, json.dumps(record).encode())
    return record_url


@pytest.mark.parametrize("how", ["flipped bit", "flipped bit, entry rewritten", "deleted optimizer.pt",
                                 "bad commit record"])
def test_a_damaged_newest_s3_checkpoint_is_reported_set_aside_and_the_previous_used(bucket, caplog, how):
    root = f"{bucket}/run/checkpoints"
    for step in (2, 4):
        _save(root, step)
    named = _damage(f"{root}/{ckpt.step_dir_name(4)}", how)
    atomic.clean_stale_tmp(root)                                  # what a run does first
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        directory, state = ckpt.resume_point(root, {"seed": 0})
    assert str(directory) == f"{root}/{ckpt.step_dir_name(2)}" and state.step == 2
    report = " ".join(r.getMessage() for r in caplog.records)
    assert f"{root}/{ckpt.step_dir_name(4)} is damaged" in report and named in report
    assert [s for s, _ in ckpt.list_checkpoints(root)] == [2]
    aside = {rel.split("/")[0] for rel, _, _ in storage.list_files(root, hidden=True)}
    assert aside == {ckpt.step_dir_name(2), ckpt.step_dir_name(4) + ckpt.DAMAGED_SUFFIX}   # kept for a post-mortem
    assert ckpt.resume_point(root, {"seed": 0})[1].step == 2                               # and no longer tried


def _save(root: str, step: int):
    w = {"a.weight": torch.full((8, 8), float(step)), "b.weight": torch.arange(5, dtype=torch.float32)}
    opt = {"state": {0: {"momentum_buffer": torch.ones(16)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    state = ckpt.CheckpointState(step=step, tokens_seen=step, model={"d_model": 8}, config={"seed": 0})
    return ckpt.save_checkpoint(f"{root}/{ckpt.step_dir_name(step)}", w, opt, state)


def test_an_s3_run_dir_gets_every_run_output_average_metrics_and_summary(bucket):
    sets = _s3_shard_sets(bucket)
    run_dir = f"{bucket}/run"
    cfg = run_config(run_dir, sets, **{"train.steps": 4, "checkpoint.every_steps": 2, "checkpoint.keep_last": 1,
                                       "average": {"n": 2, "spacing": 2}, "log.tensorboard": True})
    summary = train(load_run_config(None, data=cfg))
    assert summary["average_eval_loss"] is not None
    assert summary["run_dir"] == run_dir and summary["average"] == f"{run_dir}/average"
    assert summary["metrics"] == f"{run_dir}/metrics.jsonl"
    average = ckpt.read_state(f"{run_dir}/average")
    assert average.kind == "average" and [s["step"] for s in average.sources] == [2, 4]
    assert all(s["path"].startswith(f"{run_dir}/checkpoints/") for s in average.sources)
    assert json.loads(storage.path(f"{run_dir}/summary.json").read_text()) == summary
    records = [json.loads(line) for line in storage.path(f"{run_dir}/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("kind") == "train"] == [1, 2, 3, 4]
    assert any(r.get("model") == "average" and r["eval_loss"] == summary["average_eval_loss"] for r in records)
    assert any(rel.startswith("events.out.tfevents") for rel, _, _ in storage.list_files(f"{run_dir}/tensorboard"))

    # started again on a machine without the local scratch: the metrics come back from s3, the
    # finished average is found there and not rebuilt
    shutil.rmtree(storage.local_scratch(run_dir))
    stamp = storage.record_stamp(f"{run_dir}/average")
    again = train(load_run_config(None, data=cfg))
    assert again["average_eval_loss"] == summary["average_eval_loss"] and again["step"] == 4
    assert storage.record_stamp(f"{run_dir}/average") == stamp
    assert storage.path(f"{run_dir}/metrics.jsonl").read_text().splitlines() == [json.dumps(r, sort_keys=True)
                                                                                 for r in records]
