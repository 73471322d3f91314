"""`python -m mixtures export`: each format read back by its own ecosystem's reader (Megatron-Core's
IndexedDataset, `datasets.load_from_disk` and its parquet loader, datatrove's dataset) and compared
token by token with `ShardReader`'s stream of a materialized curriculum set (buckets, a phase
transition and repeated documents)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from mixtures import ShardReader, write_token_lists
from mixtures.__main__ import main
from mixtures.export import ExportRecord, document_chunks, export_set, plan_files
from mixtures.materialize import materialize
from mixtures.shards import ShardManifest, ShardSet
from mixtures.spec import parse_spec


@pytest.fixture(scope="module")
def curriculum_set(tmp_path_factory, components, tokenizer_json):
    """p2-curriculum: 4 buckets after a transition from p1, the code component repeated."""
    spec = {"name": "export", "tokenizer": {"kind": "hf", "path": str(tokenizer_json)}, "seq_len": 32,
            "bucket_count": 4, "seeds": {"bucket_shuffle": 1, "uniform": 2, "replay": 3, "budget": 4},
            "components": [{"name": "web", "path": str(components["web"]), "score_field": "edu"},
                           {"name": "math", "path": str(components["math"]), "score_field": "math"},
                           {"name": "code", "path": str(components["code"]), "repeat": "uniform"}],
            "phases": [{"name": "p1", "components": {"web": 0.8, "math": 0.1, "code": 0.1}},
                       {"name": "p2", "orders": ["curriculum"], "transition_tokens": 4_000,
                        "components": {"web": {}, "math": {}, "code": {"n_tokens": 30_000}}}]}
    out = tmp_path_factory.mktemp("sets")
    materialize(parse_spec(spec), out, progress=lambda m: None)
    return out / "p2-curriculum"


def reader_stream(path) -> np.ndarray:
    """Every token `ShardReader` streams (windows of one batch each), rebuilt into one array."""
    reader = ShardReader(path, global_batch_size=1)
    parts = []
    for batch in reader:
        parts.append(batch["input_ids"][0])
        last = batch["labels"][0, -1]
    return np.concatenate(parts + [[last]])


def documents(path) -> list[np.ndarray]:
    ss = ShardSet.open(path)
    tokens, _, doc, _ = ss.read(0, ss.n_tokens)
    return np.split(tokens, np.flatnonzero(np.diff(doc)) + 1)


def check_stream(exported: np.ndarray, path) -> None:
    """The export is the whole stream; ShardReader's windows are a prefix of it, token for token."""
    seen = reader_stream(path)
    m = ShardManifest.read(path)
    assert exported.size == m.n_tokens
    assert seen.size > m.n_tokens - 2 * m.seq_len
    np.testing.assert_array_equal(exported[:seen.size], seen)


def test_the_curriculum_set_has_what_the_export_must_keep(curriculum_set):
    m = ShardManifest.read(curriculum_set)
    assert [s.name for s in m.segments][:2] == ["t0000", "b0000"] and m.bucket_count == 4
    idx = pa.concat_tables([ShardSet.open(curriculum_set).read_index(i) for i in range(len(m.shards))])
    assert max(idx.column("copy").to_pylist()) >= 1                        # repetition materialized


def test_megatron_export_read_by_megatron_core(curriculum_set, tmp_path):
    idx_mod = pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                  reason="megatron-core (the `test` extra) is not installed")
    record = export_set(curriculum_set, "megatron", tmp_path / "mg", progress=lambda m: None)
    ds = idx_mod.IndexedDataset(str(tmp_path / "mg" / curriculum_set.name))
    docs = documents(curriculum_set)
    assert len(ds) == record.n_docs == len(docs)
    np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
    assert ds.index.dtype == np.uint16
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i], docs[i])
    check_stream(np.concatenate(ds[0:len(ds)]), curriculum_set)
    copy = ShardManifest.read(tmp_path / "mg" / "shards.manifest.json")
    assert copy.set_digest == ShardManifest.read(curriculum_set).set_digest
    assert ExportRecord.read(tmp_path / "mg").spec_hash == copy.spec_hash is not None


def test_megatron_export_of_a_uint32_set_is_int32(tmp_path):
    idx_mod = pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                  reason="megatron-core (the `test` extra) is not installed")
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 70_000, size=int(n)) for n in rng.integers(1, 40, size=50)]
    write_token_lists(tmp_path / "big", docs, seq_len=8, vocab_size=70_000, eos_id=0, docs_per_shard=13)
    export_set(tmp_path / "big", "megatron", tmp_path / "mg", progress=lambda m: None)
    ds = idx_mod.IndexedDataset(str(tmp_path / "mg" / "big"))
    assert ds.index.dtype == np.int32
    check_stream(np.concatenate(ds[0:len(ds)]), tmp_path / "big")


def test_hf_export_read_by_datasets(curriculum_set, tmp_path):
    import datasets

    export_set(curriculum_set, "hf", tmp_path / "hf", progress=lambda m: None)
    docs = documents(curriculum_set)
    on_disk = datasets.load_from_disk(str(tmp_path / "hf"))
    parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "hf" / "parquet" / "*.parquet"),
                                    split="train", cache_dir=str(tmp_path / "cache"))
    for ds in (on_disk, parquet):
        assert ds.num_rows == len(docs) and ds.features["input_ids"].feature.dtype == "uint16"
        rows = [np.asarray(r) for r in ds.with_format("numpy")["input_ids"]]
        for got, want in zip(rows, docs):
            np.testing.assert_array_equal(got, want)
        check_stream(np.concatenate(rows), curriculum_set)


def test_hf_export_of_an_sft_set_carries_the_loss_mask_and_megatron_refuses_it(tmp_path, capsys):
    import datasets

    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    masks = [[0, 1, 1], [0, 1], [0, 0, 1, 1]]
    write_token_lists(tmp_path / "sft", docs, seq_len=4, vocab_size=100, eos_id=1, loss_masks=masks)
    export_set(tmp_path / "sft", "hf", tmp_path / "hf", progress=lambda m: None)
    ds = datasets.load_from_disk(str(tmp_path / "hf"))
    assert ds["loss_mask"] == [[0, 1, 1, 1], [0, 1, 1], [0, 0, 1, 1, 1]]      # EOS follows the last token
    assert ds["input_ids"] == [[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1]]
    assert main(["export", str(tmp_path / "sft"), "--format", "megatron", "--out", str(tmp_path / "mg")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "sft") in err and "--format hf" in err
    assert not (tmp_path / "mg").exists()


def test_nanotron_export_read_by_datatrove(curriculum_set, tmp_path):
    from datatrove.utils.dataset import DatatroveFolderDataset

    export_set(curriculum_set, "nanotron", tmp_path / "nt", progress=lambda m: None)
    m = ShardManifest.read(curriculum_set)
    ds = DatatroveFolderDataset(str(tmp_path / "nt"), seq_len=m.seq_len, token_size=2)
    windows = np.concatenate([ds[i]["input_ids"].numpy() for i in range(len(ds))])
    stream = np.concatenate(documents(curriculum_set))
    np.testing.assert_array_equal(windows, stream[:windows.size])
    assert windows.size == (m.n_tokens // (m.seq_len + 1)) * (m.seq_len + 1)
    ends = np.fromfile(tmp_path / "nt" / f"{curriculum_set.name}.ds.index", dtype="<u8")
    np.testing.assert_array_equal(ends, np.cumsum([d.size for d in documents(curriculum_set)]))


def test_exports_are_deterministic_and_a_corrupt_set_leaves_no_output(curriculum_set, tmp_path):
    a = export_set(curriculum_set, "hf", tmp_path / "a", progress=lambda m: None)
    b = export_set(curriculum_set, "hf", tmp_path / "b", progress=lambda m: None)
    assert a.files == b.files
    bad = tmp_path / "bad"
    write_token_lists(bad, [[3, 4, 5]] * 400, seq_len=8, vocab_size=100, eos_id=1)
    tokens = next(bad.glob("*.bin"))
    data = bytearray(tokens.read_bytes())
    data[1000] ^= 0xFF
    tokens.write_bytes(bytes(data))
    assert main(["export", str(bad), "--format", "megatron", "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("case", ["missing set", "unknown format", "existing out"])
def test_bad_requests_are_one_line_exit_2(curriculum_set, tmp_path, capsys, case):
    (tmp_path / "taken").mkdir()
    argv = {"missing set": [str(tmp_path / "nope"), "--format", "hf", "--out", str(tmp_path / "o")],
            "unknown format": [str(curriculum_set), "--format", "torch", "--out", str(tmp_path / "o")],
            "existing out": [str(curriculum_set), "--format", "hf", "--out", str(tmp_path / "taken")]}[case]
    named = {"missing set": tmp_path / "nope", "unknown format": curriculum_set, "existing out": tmp_path / "taken"}[case]
    assert main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m mixtures: error: ") and str(named) in err
    assert not (tmp_path / "o").exists()


def test_document_chunks_and_file_plan():
    lengths = np.array([3, 4, 10, 1, 1, 2])
    assert document_chunks(lengths, 7) == [(0, 2), (2, 3), (3, 6)]
    assert document_chunks(lengths, 100) == [(0, 6)]
    assert document_chunks(np.array([], dtype=np.int64), 5) == []
    assert plan_files([5, 5, 0, 5, 20, 1], 10) == [0, 0, 0, 1, 1, 2]
    assert plan_files([], 10) == []


def test_export_record_lists_every_file(curriculum_set, tmp_path):
    record = export_set(curriculum_set, "megatron", tmp_path / "mg", progress=lambda m: None)
    raw = json.loads((tmp_path / "mg" / "export.json").read_text())
    assert raw["schema"] == "export/1" and raw["format"] == "megatron"
    on_disk = sorted(p.relative_to(tmp_path / "mg").as_posix() for p in (tmp_path / "mg").rglob("*")
                     if p.is_file() and p.name != "export.json")
    assert [f.path for f in record.files] == on_disk


def _gpt_dataset(prefix: str, cache, seq_len: int, num_samples: int, eod: int):
    """Megatron-Core's GPTDataset over our export, as `pretrain_gpt.py` builds it (train split)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer

    class Ids(MegatronLegacyTokenizer):                # ids in, ids out: the export is already tokenized
        def tokenize(self, text):
            return []

        vocab = inv_vocab = property(lambda self: {})
        vocab_size = property(lambda self: 1 << 16)
        eod = property(lambda self: eod)

    config = GPTDatasetConfig(random_seed=1234, sequence_length=seq_len, blend=([prefix], None), split="100,0,0",
                              path_to_cache=str(cache), tokenizer=Ids("ids"), reset_position_ids=False,
                              reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_samples, None, None], lambda: True, config).build()
    return train


def test_megatron_gpt_dataset_sees_our_order_after_megatron_order(curriculum_set, tmp_path, capsys):
    pytest.importorskip("megatron.core.datasets.gpt_dataset", reason="megatron-core (the `test` extra) is not installed")
    export_set(curriculum_set, "megatron", tmp_path / "mg", progress=lambda m: None)
    prefix = str(tmp_path / "mg" / curriculum_set.name)
    m = ShardManifest.read(curriculum_set)
    reader = ShardReader(curriculum_set, global_batch_size=1)
    n = reader.steps_per_epoch
    shuffled = _gpt_dataset(prefix, tmp_path / "cache", m.seq_len, n, m.eos_id)
    windows = [next(reader) for _ in range(n)]
    first = np.asarray(shuffled[0]["tokens"])
    assert not np.array_equal(first, windows[0]["input_ids"][0])          # Megatron shuffles by default
    assert main(["megatron-order", str(tmp_path / "cache")]) == 0
    assert "now in the export's order" in capsys.readouterr().out
    ordered = _gpt_dataset(prefix, tmp_path / "cache", m.seq_len, n, m.eos_id)
    assert len(ordered) >= n
    for i, w in enumerate(windows):
        np.testing.assert_array_equal(np.asarray(ordered[i]["tokens"]), w["input_ids"][0])
        np.testing.assert_array_equal(np.asarray(ordered[i]["labels"]), w["labels"][0])


def test_megatron_order_over_two_epochs_continues_the_stream(curriculum_set, tmp_path):
    pytest.importorskip("megatron.core.datasets.gpt_dataset", reason="megatron-core (the `test` extra) is not installed")
    export_set(curriculum_set, "megatron", tmp_path / "mg", progress=lambda m: None)
    prefix = str(tmp_path / "mg" / curriculum_set.name)
    m = ShardManifest.read(curriculum_set)
    n = (m.n_tokens - 1) // m.seq_len + m.n_tokens // (2 * m.seq_len)         # one and a half epochs
    _gpt_dataset(prefix, tmp_path / "cache", m.seq_len, n, m.eos_id)
    assert main(["megatron-order", str(tmp_path / "cache")]) == 0
    ds = _gpt_dataset(prefix, tmp_path / "cache", m.seq_len, n, m.eos_id)
    twice = np.concatenate(documents(curriculum_set) * 2)
    L = m.seq_len
    for i in range(n):
        np.testing.assert_array_equal(np.asarray(ds[i]["tokens"]), twice[i * L:(i + 1) * L])
        np.testing.assert_array_equal(np.asarray(ds[i]["labels"]), twice[i * L + 1:(i + 1) * L + 1])
