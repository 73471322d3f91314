"""The trainer against a real S3 endpoint (moto on loopback): shard sets read from s3 (staged into the
local cache, sha256-checked, then memory-mapped), checkpoints written to s3 through the commit
protocol, and a second run resuming from them."""

from common import storage
from mixtures import write_token_lists
from tests.trainer.conftest import SEQ_LEN, VOCAB, run_config, synthetic_docs
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.data import EOS_SYNTHETIC
from trainer.train import train


def test_train_on_s3_shards_checkpointing_to_s3_then_resume(bucket, tmp_path):
    sets = {"train": f"{bucket}/shards/train", "heldout": f"{bucket}/shards/heldout"}
    write_token_lists(sets["train"], synthetic_docs(0, 120), seq_len=SEQ_LEN, vocab_size=VOCAB, eos_id=EOS_SYNTHETIC,
                      docs_per_shard=60)
    write_token_lists(sets["heldout"], synthetic_docs(10**6, 20), seq_len=SEQ_LEN, vocab_size=VOCAB,
                      eos_id=EOS_SYNTHETIC)
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

    # the same run, longer: resumes from the s3 checkpoint of step 6
    longer = run_config(run_dir, sets, **{"train.steps": 8, "checkpoint.every_steps": 2, "checkpoint.keep_last": 2,
                                          "schedule.extend": True})
    again = train(load_run_config(None, data=longer))
    assert again["step"] == 8
    assert [s for s, _ in ckpt.list_checkpoints(f"{run_dir}/checkpoints")] == [6, 8]
    assert ckpt.read_state(ckpt.latest_checkpoint(f"{run_dir}/checkpoints")).tokens_seen == 8 * 4 * SEQ_LEN
