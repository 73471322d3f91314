"""The shard set contract and THE reader: packing, DP split, exact resume, eval mode, integrity."""

import json

import numpy as np
import pytest

from mixtures.reader import EvalReader, ShardReader
from mixtures.shards import (ShardError, ShardManifest, ShardSet, TokenizerIdentity, TokenizerMismatch,
                             token_dtype, write_token_lists)

EOS = 0


def _docs(n=60, seed=0, vocab=1000):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=int(rng.integers(1, 40))).tolist() for _ in range(n)]


def _stream(docs):
    return np.concatenate([np.append(np.asarray(d, dtype=np.int64), EOS) for d in docs])


@pytest.fixture
def shard_dir(tmp_path):
    docs = _docs()
    write_token_lists(tmp_path / "set", docs, seq_len=16, vocab_size=1000, eos_id=EOS, docs_per_shard=7)
    return tmp_path / "set", docs


def test_token_dtype_fits_vocab():
    assert token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")
    assert token_dtype(151_936) == np.dtype("<u4")


def test_stream_is_documents_with_eos_in_order(shard_dir):
    path, docs = shard_dir
    ss = ShardSet.open(path)
    want = _stream(docs)
    tokens, _, doc, doc_start = ss.read(0, ss.n_tokens)
    assert np.array_equal(tokens, want)
    assert len(ss.manifest.shards) == 9  # 60 docs, 7 per shard
    # doc ordinals and starts agree with the documents' lengths
    lens = np.array([len(d) + 1 for d in docs])
    assert np.array_equal(np.bincount(doc), lens)
    assert np.array_equal(np.unique(doc_start), np.concatenate([[0], np.cumsum(lens)[:-1]]))


def test_uint32_when_vocab_does_not_fit(tmp_path):
    docs = [[70_000, 1, 2], [151_000]]
    m = write_token_lists(tmp_path / "s", docs, seq_len=4, vocab_size=151_936, eos_id=151_643)
    assert m.dtype == "uint32"
    assert (tmp_path / "s" / "shard-00000.bin").stat().st_size == 6 * 4
    toks, *_ = ShardSet.open(tmp_path / "s").read(0, 6)
    assert toks.tolist() == [70_000, 1, 2, 151_643, 151_000, 151_643]
    with pytest.raises(ValueError, match="outside"):
        write_token_lists(tmp_path / "t", [[70_000]], seq_len=4, vocab_size=1000, eos_id=0)


def test_windows_cover_every_target_once_and_labels_shift(shard_dir):
    path, docs = shard_dir
    want = _stream(docs)
    r = ShardReader(path, global_batch_size=4, seq_len=16)
    seen_inputs, seen_labels = [], []
    for batch in r:
        assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == np.int64
        assert np.array_equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
        assert batch["loss_mask"].all()
        seen_inputs.append(batch["input_ids"].reshape(-1))
        seen_labels.append(batch["labels"].reshape(-1))
    n = r.steps_per_epoch * r.tokens_per_step
    assert r.steps_per_epoch == (len(want) - 1) // 64
    assert np.array_equal(np.concatenate(seen_inputs), want[:n])
    assert np.array_equal(np.concatenate(seen_labels), want[1:n + 1])


def test_document_boundaries_positions_and_doc_ids(shard_dir):
    path, docs = shard_dir
    lens = np.array([len(d) + 1 for d in docs])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    r = ShardReader(path, global_batch_size=2, seq_len=16)
    for step, batch in enumerate(r):
        for row in range(2):
            w0 = step * 32 + row * 16
            gpos = np.arange(w0, w0 + 16)
            doc = np.searchsorted(starts, gpos, side="right") - 1
            assert np.array_equal(batch["doc_ids"][row], doc)
            assert np.array_equal(batch["position_ids"][row], gpos - np.maximum(starts[doc], w0))
            # an EOS input ends its document: the next input starts a new one at position 0
            eos_at = np.where(batch["input_ids"][row][:-1] == EOS)[0]
            assert (batch["position_ids"][row][eos_at + 1] == 0).all()


def test_data_parallel_ranks_split_the_global_batch(shard_dir):
    path, _ = shard_dir
    whole = list(ShardReader(path, global_batch_size=4, seq_len=16))
    for world in (2, 4):
        parts = [list(ShardReader(path, global_batch_size=4, seq_len=16, rank=r, world_size=world))
                 for r in range(world)]
        for step, batch in enumerate(whole):
            for key in batch:
                joined = np.concatenate([parts[r][step][key] for r in range(world)])
                assert np.array_equal(joined, batch[key]), (world, step, key)
    with pytest.raises(ValueError, match="multiple of world_size"):
        ShardReader(path, global_batch_size=3, world_size=2, rank=0)


def test_exact_resume_from_state_dict_even_with_another_world_size(shard_dir):
    path, _ = shard_dir
    straight = list(ShardReader(path, global_batch_size=2, seq_len=16))
    a = ShardReader(path, global_batch_size=2, seq_len=16)
    for _ in range(5):
        next(a)
    state = json.loads(json.dumps(a.state_dict()))   # it must survive a JSON checkpoint
    assert state["token_offset"] == 5 * 2 * 16
    b = ShardReader(path, global_batch_size=2, seq_len=16)
    b.load_state_dict(state)
    rest = list(b)
    assert len(rest) == len(straight) - 5
    for x, y in zip(rest, straight[5:]):
        assert all(np.array_equal(x[k], y[k]) for k in x)
    # resumed on two ranks: rank 1 gets the second window of each remaining global batch
    c = ShardReader(path, global_batch_size=2, seq_len=16, rank=1, world_size=2)
    c.load_state_dict(state)
    assert np.array_equal(next(c)["input_ids"][0], straight[5]["input_ids"][1])


def test_seek_step_is_step_times_tokens_per_step(shard_dir):
    """Puro behaviour 15: resuming at global step s reads from token offset s * GBS * seq_len."""
    path, docs = shard_dir
    want = _stream(docs)
    r = ShardReader(path, global_batch_size=2, seq_len=8)
    r.seek_step(7)
    assert r.token_offset == 7 * 2 * 8
    assert np.array_equal(next(r)["input_ids"][0], want[112:120])


def test_cursor_of_another_shard_set_is_refused(shard_dir, tmp_path):
    path, docs = shard_dir
    write_token_lists(tmp_path / "other", docs[::-1], seq_len=16, vocab_size=1000, eos_id=EOS)
    a = ShardReader(tmp_path / "other", global_batch_size=2)
    b = ShardReader(path, global_batch_size=2)
    with pytest.raises(ShardError, match="different shard set"):
        b.load_state_dict(a.state_dict())


def test_loop_starts_next_epoch_in_the_same_order(shard_dir):
    path, _ = shard_dir
    r = ShardReader(path, global_batch_size=4, seq_len=16, loop=True)
    first = [next(r) for _ in range(r.steps_per_epoch)]
    again = next(r)
    assert r.epoch == 1 and np.array_equal(again["input_ids"], first[0]["input_ids"])
    assert r.tokens_consumed == (r.steps_per_epoch + 1) * r.tokens_per_step


def test_sft_loss_mask_follows_targets(tmp_path):
    docs = [[5, 6, 7, 8], [9, 10, 11]]
    masks = [[0, 0, 1, 1], [0, 1, 1]]
    m = write_token_lists(tmp_path / "sft", docs, seq_len=8, vocab_size=100, eos_id=EOS, loss_masks=masks)
    assert m.kind == "sft" and m.shards[0].n_loss_tokens == 2 + 1 + 2 + 1
    batch = next(ShardReader(tmp_path / "sft", global_batch_size=1, seq_len=8))
    # stream 5 6 7 8 E 9 10 11 E, mask 0 0 1 1 1 0 1 1 1; loss_mask[t] is the mask of labels[t]
    assert batch["labels"][0].tolist() == [6, 7, 8, EOS, 9, 10, 11, EOS]
    assert batch["loss_mask"][0].tolist() == [False, True, True, True, False, True, True, True]


def test_eval_reader_reads_every_target_once_over_ranks(shard_dir):
    path, docs = shard_dir
    want = _stream(docs)
    for world in (1, 3):
        labels = []
        n_batches = set()
        for rank in range(world):
            ev = EvalReader(path, batch_size=4, seq_len=16, rank=rank, world_size=world)
            batches = list(ev)
            n_batches.add(len(batches))
            assert batches == [] or all(b["input_ids"].shape == (4, 16) for b in batches)
            assert len(list(ev)) == len(batches)            # a fixed set, read again identically
            for b in batches:
                labels.append(b["labels"][b["loss_mask"]])
        assert len(n_batches) == 1                         # every rank runs the same number of steps
        got = np.sort(np.concatenate(labels))
        assert np.array_equal(got, np.sort(want[1:]))


def test_truncated_shard_fails_clearly_on_open(shard_dir):
    path, _ = shard_dir
    f = path / "shard-00003.bin"
    f.write_bytes(f.read_bytes()[:-2])
    with pytest.raises(ShardError, match="shard-00003.bin.*truncated"):
        ShardReader(path, global_batch_size=2)


def test_one_byte_corruption_detected_by_hash(shard_dir):
    path, _ = shard_dir
    ShardSet.open(path, verify_hashes=True)
    f = path / "shard-00002.bin"
    data = bytearray(f.read_bytes())
    data[5] ^= 0x01
    f.write_bytes(bytes(data))
    ShardSet.open(path)                          # sizes still match
    with pytest.raises(ShardError, match="shard-00002.bin.*corrupted"):
        ShardReader(path, global_batch_size=2, verify_hashes=True)


def test_tampered_index_is_detected(shard_dir):
    path, _ = shard_dir
    manifest = ShardManifest.read(path)
    # swap two shards' indexes: sizes differ, so open refuses
    a, b = path / "shard-00000.idx.parquet", path / "shard-00001.idx.parquet"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    if manifest.shards[0].index_n_bytes != manifest.shards[1].index_n_bytes:
        with pytest.raises(ShardError):
            ShardSet.open(path)
    else:
        with pytest.raises(ShardError):
            ShardSet.open(path, verify_hashes=True)


def test_tokenizer_mismatch_is_refused(tmp_path):
    ident = TokenizerIdentity(kind="hf", name="toy", vocab_size=500, eos_id=1, files={"tokenizer.json": "ab" * 32})
    other = TokenizerIdentity(kind="hf", name="toy", vocab_size=500, eos_id=1, files={"tokenizer.json": "cd" * 32})
    write_token_lists(tmp_path / "s", _docs(10, vocab=500), seq_len=8, tokenizer=ident)
    ShardReader(tmp_path / "s", global_batch_size=1, tokenizer=ident)
    with pytest.raises(TokenizerMismatch, match="toy"):
        ShardReader(tmp_path / "s", global_batch_size=1, tokenizer=other)
    with pytest.raises(TokenizerMismatch):
        EvalReader(tmp_path / "s", batch_size=1, tokenizer=other.digest)


def test_writing_is_deterministic(tmp_path):
    docs = _docs(30, seed=3)
    write_token_lists(tmp_path / "a", docs, seq_len=8, vocab_size=1000, eos_id=EOS, docs_per_shard=10)
    write_token_lists(tmp_path / "b", docs, seq_len=8, vocab_size=1000, eos_id=EOS, docs_per_shard=10)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "manifest.json" in files and "shard-00002.idx.parquet" in files
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_too_small_for_one_global_batch(tmp_path):
    write_token_lists(tmp_path / "s", [[1, 2, 3]], seq_len=8, vocab_size=10, eos_id=EOS)
    with pytest.raises(ShardError, match="fewer than one global batch"):
        ShardReader(tmp_path / "s", global_batch_size=1)
    assert len(EvalReader(tmp_path / "s", batch_size=2)) == 1
