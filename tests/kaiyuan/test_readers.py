"""Readers: every record becomes a document or a quarantined row with its reason and origin."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from kaiyuan import readers

OPTS = readers.ReadOptions(text_field="text", id_field="id", max_text_bytes=1000)


def _read_all(files, opts=OPTS, split_bytes=1 << 40):
    splits = readers.plan_splits("src", files, split_bytes)
    ranged = [s for s in splits if s.format == "jsonl" and s.compression is None and s.end >= 0]
    if ranged:
        counts = {(s.path, s.start): readers.count_newlines(s.path, s.start, s.end) for s in ranged}
        splits = readers.number_lines(splits, counts)
    counters = {}
    rows = []
    for s in splits:
        for b in readers.read_split(s, opts, counters):
            rows.extend(b.to_pylist())
    return rows, counters, splits


BAD_LINES = [
    (b'{"id": "ok1", "text": "fine document", "lang": "en", "n": 3}', None),
    (b'{bad json', "malformed_json"),
    (b'{"id": "u", "text": "caf\xe9"}', "invalid_utf8"),
    (b'[1, 2, 3]', "not_an_object"),
    (b'{"id": "m"}', "missing_text"),
    (b'{"id": "n", "text": null}', "missing_text"),
    (b'{"id": "i", "text": 42}', "non_string_text"),
    (b'{"id": "e", "text": "   "}', "empty_text"),
    (b'{"id": "big", "text": "' + b"x" * 2000 + b'"}', "too_large"),
    (b'{"id": "s", "text": "\\ud800 lone surrogate"}', "malformed_json"),
    (b'{"id": 7, "text": "numeric id"}', None),
]


def _write_lines(path, lines, opener=open):
    with opener(path, "wb") as fh:
        for line, _ in lines:
            fh.write(line + b"\n")
        fh.write(b"\n")                      # a blank line: not a record, counted


@pytest.mark.parametrize("kind", ["plain", "gz", "zst"])
def test_jsonl_quarantine_reasons_and_origins(tmp_path, kind):
    if kind == "plain":
        path = tmp_path / "a.jsonl"
        _write_lines(path, BAD_LINES)
    elif kind == "gz":
        path = tmp_path / "a.jsonl.gz"
        _write_lines(path, BAD_LINES, gzip.open)
    else:
        path = tmp_path / "a.jsonl.zst"
        raw = b"".join(line + b"\n" for line, _ in BAD_LINES) + b"\n"
        path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    files = readers.discover_files([str(path)])
    assert files[0].compression == {"plain": None, "gz": "gzip", "zst": "zstd"}[kind]
    rows, counters, _ = _read_all(files)
    assert len(rows) == len(BAD_LINES)
    assert counters["blank_lines"] == 1
    for i, (row, (_, reason)) in enumerate(zip(rows, BAD_LINES)):
        assert row["reason"] == reason, (i, row)
        assert row["origin_line"] == i + 1
        assert row["origin_file"] == files[0].path
        if reason:
            assert row["id"] is None and row["text"] is None and row["detail"]
            assert row["raw_prefix"] is not None or reason == "too_large"
    ok = rows[0]
    assert ok["id"] == "ok1" and ok["text"] == "fine document"
    assert dict(ok["meta"]) == {"lang": "en", "n": "3"}
    assert rows[-1]["id"] == "7"


def test_oversized_line_is_quarantined_without_reading_it_whole(tmp_path):
    opts = readers.ReadOptions(max_text_bytes=100)
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"text": "' + b"y" * 50_000_000 + b'"}\n')       # a single 50 MB document
        fh.write(b'{"text": "after the big one"}\n')
    rows, _, _ = _read_all(readers.discover_files([str(path)]), opts)
    assert [r["reason"] for r in rows] == ["too_large", None]
    assert rows[1]["origin_line"] == 2 and rows[1]["text"] == "after the big one"
    assert len(rows[0]["raw_prefix"]) <= opts.raw_prefix_chars


def test_byte_range_splits_give_the_same_records_and_line_numbers(tmp_path):
    path = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": f"doc {i} " + "z" * (i % 37)}) for i in range(500)]
    lines.insert(100, "")
    lines.insert(200, "not json")
    path.write_text("\n".join(lines) + "\n")
    files = readers.discover_files([str(path)])
    whole, c1, s1 = _read_all(files)
    split, c2, s2 = _read_all(files, split_bytes=997)
    assert len(s1) == 1 and len(s2) > 10
    assert whole == split
    assert c1 == c2 == {"blank_lines": 1}
    ids = [r["id"] for r in whole if r["reason"] is None]
    assert len(ids) == len(set(ids)) == 500         # derived ids: distinct
    again, _, _ = _read_all(files, split_bytes=5000)
    assert [r["id"] for r in again] == [r["id"] for r in whole]


def test_parquet_rows_are_checked_and_other_columns_go_to_meta(tmp_path):
    t = pa.table({"content": ["good text", "", None, "x" * 5000, "also good"],
                  "doc_id": [1, 2, 3, 4, 5], "score": [0.5, 0.1, None, 0.2, 0.9]})
    path = tmp_path / "p.parquet"
    pq.write_table(t, path, row_group_size=2)
    opts = readers.ReadOptions(text_field="content", id_field="doc_id", max_text_bytes=1000)
    rows, _, splits = _read_all(readers.discover_files([str(path)]), opts, split_bytes=1)
    assert len(splits) == 3                           # one per row group here
    assert [r["reason"] for r in rows] == [None, "empty_text", "missing_text", "too_large", None]
    assert [r["origin_line"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["id"] == "1" and dict(rows[0]["meta"]) == {"score": "0.5"}
    wrong = readers.ReadOptions(text_field="body")
    rows, _, _ = _read_all(readers.discover_files([str(path)]), wrong)
    assert {r["reason"] for r in rows} == {"missing_text"}


def test_parquet_text_column_of_the_wrong_type(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    rows, _, _ = _read_all(readers.discover_files([str(path)]), readers.ReadOptions())
    assert [r["reason"] for r in rows] == ["non_string_text"] * 2


def test_hf_saved_dataset(tmp_path):
    import datasets

    ds = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["alpha beta", "gamma", ""], "label": [1, 0, 1]}),
        "test": datasets.Dataset.from_dict({"text": ["delta"], "label": [0]}),
    })
    ds.save_to_disk(str(tmp_path / "hf"))
    files = readers.discover_files([str(tmp_path / "hf")])
    assert {f.format for f in files} == {"arrow"}
    rows, _, _ = _read_all(files, readers.ReadOptions())
    assert sorted(r["text"] for r in rows if r["reason"] is None) == ["alpha beta", "delta", "gamma"]
    assert [r["reason"] for r in rows if r["reason"]] == ["empty_text"]
    train_only = readers.discover_files([str(tmp_path / "hf")], "hf", hf_split="train")
    assert len(_read_all(train_only, readers.ReadOptions())[0]) == 3
    with pytest.raises(readers.SourceError, match="hub"):
        readers.discover_files(["no-such-user/no-such-dataset"], "hf")


def test_discovery_of_directories_and_globs(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "d" / "sub" / "b.jsonl.gz").write_bytes(gzip.compress(b'{"text": "b"}\n'))
    (tmp_path / "d" / "_skip.jsonl").write_text('{"text": "hidden"}\n')
    (tmp_path / "d" / "notes.txt").write_text("ignored")
    files = readers.discover_files([str(tmp_path / "d")])
    assert [f.rel for f in files] == ["d/a.jsonl", "d/sub/b.jsonl.gz"]
    files = readers.discover_files([str(tmp_path / "d" / "*.jsonl")])
    assert [f.rel for f in files] == ["_skip.jsonl", "a.jsonl"]
    with pytest.raises(readers.SourceError):
        readers.discover_files([str(tmp_path / "nothing*.jsonl")])
    with pytest.raises(readers.SourceError):
        readers.discover_files([str(tmp_path / "d" / "notes.txt")])
