"""Issue 21 (shards on the default training path): a flipped bit in a shard's tokens stops the
trainer with an error naming the file and the byte range, instead of training on it."""

import shutil

import pytest

from mixtures import ShardError
from trainer.config import load_run_config
from trainer.train import train

from .conftest import run_config


@pytest.mark.timeout(300)
def test_the_trainer_refuses_a_corrupted_shard(shard_sets, tmp_path):
    data = tmp_path / "train"
    shutil.copytree(shard_sets["train"], data)
    tokens = sorted(data.glob("*.bin"))[0]
    raw = bytearray(tokens.read_bytes())
    raw[40] ^= 0x01                                   # token 20: an id that is still inside the vocabulary
    tokens.write_bytes(bytes(raw))
    cfg = run_config(tmp_path / "run", dict(shard_sets, train=str(data)), **{"train.steps": 2})
    with pytest.raises(ShardError, match=rf"{tokens.name}: block 0 \(bytes 0-\d+\) does not match its checksum"):
        train(load_run_config(None, data=cfg))
