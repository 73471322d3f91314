"""Issue 21 (shards): corruption of a shard set is caught on the default read path and named by
file and offset; an edited manifest is refused; `inspect --verify` fails on any set it cannot read."""

import json
import warnings

import numpy as np
import pytest

from mixtures import ShardError, ShardReader, ShardSet
from mixtures.__main__ import main as mixtures_main
from mixtures.shards import BLOCK_BYTES, ShardManifest, write_token_lists

VOCAB = 5000           # uint16 tokens


def _set(path, n_docs=60, doc_len=3000, seed=0, docs_per_shard=30):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, VOCAB - 1, size=doc_len) for _ in range(n_docs)]
    return write_token_lists(path, docs, seq_len=128, vocab_size=VOCAB, eos_id=VOCAB - 1,
                             docs_per_shard=docs_per_shard)


def _read_everything(path):
    reader = ShardReader(path, global_batch_size=4)
    for _ in reader:
        pass


def test_a_set_has_a_checksum_per_block_and_reads_clean(tmp_path):
    m = _set(tmp_path / "s")
    assert all(s.block_bytes == BLOCK_BYTES for s in m.shards)
    shard_set = ShardSet.open(tmp_path / "s")
    assert shard_set._block_sums(0).size == -(-m.shards[0].n_bytes // BLOCK_BYTES) == 1
    _read_everything(tmp_path / "s")


def test_flipped_bit_below_vocab_is_named_by_file_and_offset(tmp_path):
    m = _set(tmp_path / "s", n_docs=400, docs_per_shard=200)    # 600k tokens, 1.2 MB per shard: 2 blocks
    shard = m.shards[1]
    path = tmp_path / "s" / shard.tokens_path
    assert shard.n_bytes > BLOCK_BYTES
    data = bytearray(path.read_bytes())
    offset = BLOCK_BYTES + 1000                             # token 500 of block 1: low byte, id stays < vocab
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    ShardSet.open(tmp_path / "s")                           # sizes still match: open is cheap and passes
    with pytest.raises(ShardError, match=rf"{shard.tokens_path}.*block 1 \(bytes {BLOCK_BYTES}-"):
        _read_everything(tmp_path / "s")


def _strip_block_checksums(path):
    """What a shard set written before block checksums looks like."""
    raw = json.loads((path / "manifest.json").read_text())
    for s in raw["shards"]:
        s.pop("block_bytes")
    raw.pop("manifest_digest")
    (path / "manifest.json").write_text(json.dumps(raw))


def test_old_sets_are_read_with_a_warning_and_their_ids_checked_against_the_vocabulary(tmp_path):
    m = _set(tmp_path / "s")
    _strip_block_checksums(tmp_path / "s")
    with pytest.warns(UserWarning, match="without block checksums"):
        ShardSet.open(tmp_path / "s")
    path = tmp_path / "s" / m.shards[0].tokens_path
    data = bytearray(path.read_bytes())
    data[2 * 777 + 1] ^= 0x80                               # the high byte of token 777: id >= 32768
    path.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ShardError, match=rf"{m.shards[0].tokens_path}: token id \d+ at token 777 .*"
                                             rf"outside the vocabulary of {VOCAB}"):
            _read_everything(tmp_path / "s")


def test_an_edited_manifest_is_refused(tmp_path):
    _set(tmp_path / "s")
    raw = json.loads((tmp_path / "s" / "manifest.json").read_text())
    raw["seq_len"] = 64
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ShardError, match="manifest.json: field 'manifest_digest': does not match its own digest") as e:
        ShardSet.open(tmp_path / "s")
    assert e.value.field == "manifest_digest"
    with pytest.raises(ShardError):
        ShardManifest.read(tmp_path / "s")


def test_the_manifest_digest_is_deterministic(tmp_path):
    a, b = _set(tmp_path / "a"), _set(tmp_path / "b")
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert a.to_json_dict()["manifest_digest"] == b.to_json_dict()["manifest_digest"]


def test_inspect_verify_fails_on_any_set_it_cannot_read(tmp_path, capsys):
    _set(tmp_path / "sets" / "good")
    _set(tmp_path / "sets" / "bad")
    (tmp_path / "sets" / "bad" / "manifest.json").write_text("{not json")
    _set(tmp_path / "sets" / "flipped")
    tokens = tmp_path / "sets" / "flipped" / "shard-00000.bin"
    data = bytearray(tokens.read_bytes())
    data[10] ^= 0x01
    tokens.write_bytes(bytes(data))
    assert mixtures_main(["inspect", str(tmp_path / "sets"), "--verify"]) == 1
    out, err = capsys.readouterr()
    assert "good:" in out and "bad: UNREADABLE" in out
    assert "bad" in err and "not valid JSON" in err and "flipped" in err and "sha256" in err
    assert mixtures_main(["inspect", str(tmp_path / "sets" / "good"), "--verify"]) == 0


def test_inspect_verify_reports_shard_files_whose_manifest_was_deleted(tmp_path, capsys):
    _set(tmp_path / "sets" / "good")
    _set(tmp_path / "sets" / "orphaned")
    (tmp_path / "sets" / "orphaned" / "manifest.json").unlink()
    (tmp_path / "sets" / "notes").mkdir()                     # a directory with no shard files: not a set
    (tmp_path / "sets" / "notes" / "readme.txt").write_text("x")
    assert mixtures_main(["inspect", str(tmp_path / "sets"), "--verify"]) == 1
    out, err = capsys.readouterr()
    assert "good:" in out and "orphaned: UNREADABLE" in out and "notes" not in out
    assert f"{tmp_path / 'sets' / 'orphaned' / 'manifest.json'}: no manifest here" in err
    assert mixtures_main(["inspect", str(tmp_path / "sets" / "orphaned"), "--verify"]) == 1     # named itself
    assert "orphaned: UNREADABLE" in capsys.readouterr().out
