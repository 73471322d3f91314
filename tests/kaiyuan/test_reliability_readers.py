"""Issue 21 (ingest): every damaged, unreadable or odd input file ends as quarantine rows that name
it, never as a crash of the job and never as garbled documents kept."""

import gzip
import json
import multiprocessing
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from purokit.hashing import fingerprint
from kaiyuan import readers

OPTS = readers.ReadOptions(text_field="text", id_field="id")


def _lines(n, prefix="d"):
    return b"".join(json.dumps({"id": f"{prefix}{i}", "text": f"document {i} " + "word " * 30}).encode() + b"\n"
                    for i in range(n))


def _read(paths, opts=OPTS):
    files = readers.discover_files([str(p) for p in paths])
    rows, counters = [], {}
    for split in readers.plan_splits("src", files, 1 << 40):
        for batch in readers.read_split(split, opts, counters):
            rows.extend(batch.to_pylist())
    return rows, counters


def _flip(path, offset, bit=0x10):
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


def test_zstd_with_checksum_and_a_flipped_bit_is_quarantined_not_raised(tmp_path):
    raw = _lines(200)
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(raw))
    _flip(path, path.stat().st_size // 2)
    rows, _ = _read([path])
    assert rows and all(r["reason"] is not None for r in rows)     # nothing of the frame is kept
    assert {r["reason"] for r in rows} == {"corrupt_archive"}
    assert all(r["origin_file"] == str(path) for r in rows)
    assert "zstd frame 0" in rows[-1]["detail"] and str(path) in rows[-1]["detail"]


def test_gzip_with_a_flipped_bit_keeps_no_garbled_document(tmp_path):
    raw = _lines(200)
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(raw, mtime=0))
    _flip(path, path.stat().st_size - 12)     # inside the last deflate bytes (or the CRC)
    rows, _ = _read([path])
    assert rows and [r for r in rows if r["reason"] is None] == []
    assert rows[-1]["reason"] == "corrupt_archive" and "gzip member 0" in rows[-1]["detail"]


def test_gzip_damage_in_a_later_member_keeps_the_members_before_it(tmp_path):
    first, second = _lines(50, "a"), _lines(50, "b")
    good = gzip.compress(first, mtime=0)
    bad = bytearray(gzip.compress(second, mtime=0))
    bad[-6] ^= 0x01                           # the stored CRC32 of member 1
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(good + bytes(bad))
    rows, _ = _read([path])
    docs = [r for r in rows if r["reason"] is None]
    assert [d["id"] for d in docs] == [f"a{i}" for i in range(50)]
    damaged = [r for r in rows if r["reason"] == "corrupt_archive"]
    assert len(damaged) == 51                  # the 50 records of member 1, then the member itself
    assert [r["origin_line"] for r in damaged[:50]] == list(range(51, 101))
    assert "gzip member 1" in damaged[-1]["detail"] and "incorrect data check" in damaged[-1]["detail"]


def test_truncated_gzip_is_corrupt_archive(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(_lines(100), mtime=0)[:-30])
    rows, _ = _read([path])
    assert [r for r in rows if r["reason"] is None] == []
    assert rows[-1]["reason"] == "corrupt_archive" and "truncated" in rows[-1]["detail"]


def test_zstd_without_checksum_is_counted_as_unchecked(tmp_path):
    """Documented limit: a frame without a checksum cannot be verified; it is read and counted."""
    path = tmp_path / "n.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor(write_checksum=False).compress(_lines(10)))
    rows, counters = _read([path])
    assert len([r for r in rows if r["reason"] is None]) == 10
    assert counters["unchecked_members"] == 1


def test_multi_frame_zstd_is_read_to_the_end(tmp_path):
    c = zstandard.ZstdCompressor(write_checksum=True)
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(c.compress(_lines(5, "a")) + c.compress(_lines(5, "b")))
    rows, _ = _read([path])
    assert [r["id"] for r in rows] == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(5)]


@pytest.mark.parametrize("content", [b"PAR1 this is not parquet", None])
def test_fake_or_truncated_parquet_is_one_unreadable_row_naming_the_file(tmp_path, content):
    path = tmp_path / "x.parquet"
    if content is None:
        pq.write_table(pa.table({"text": ["a", "b"]}), path)
        path.write_bytes(path.read_bytes()[:-20])
    else:
        path.write_bytes(content)
    good = tmp_path / "good.jsonl"
    good.write_bytes(_lines(3))
    rows, _ = _read([path, good])
    assert [r["reason"] for r in rows] == ["unreadable", None, None, None]
    assert rows[0]["origin_file"] == str(path) and str(path) in rows[0]["detail"]


def test_recursive_glob_skips_a_dangling_symlink_like_the_directory_walk(tmp_path):
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "a.jsonl").write_bytes(_lines(2))
    (d / "sub" / "gone.jsonl").symlink_to(tmp_path / "missing.jsonl")
    by_dir = readers.discover_files([str(d)])
    by_glob = readers.discover_files([str(d / "**" / "*.jsonl")])
    assert [f.path for f in by_glob] == [f.path for f in by_dir] == [str((d / "sub" / "a.jsonl").resolve())]
    with pytest.raises(readers.SourceError, match="not found"):
        readers.discover_files([str(d / "sub" / "gone.jsonl")])       # named plainly: still an error


def test_bom_is_stripped_and_non_finite_numbers_kept_as_text(tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"id": "x", "text": "first", "w": 1e400}\n'
                     + b'{"id": "y", "text": "second", "big": 123456789012345678901234567890}\n'
                     + b'{"id": "z", "text": "bad", "w": NaN}\n')
    rows, _ = _read([path])
    assert [r["reason"] for r in rows] == [None, None, "malformed_json"]     # NaN is not JSON
    assert rows[0]["id"] == "x" and dict(rows[0]["meta"]) == {"w": "1e400"}
    assert dict(rows[1]["meta"])["big"] in ("1.2345678901234568e+29", "123456789012345678901234567890")


def test_numeric_ids_are_stringified_the_same_everywhere(tmp_path):
    path = tmp_path / "i.jsonl"
    path.write_bytes(b'{"id": 7, "text": "int id"}\n{"id": "7", "text": "string id"}\n')
    rows, _ = _read([path])
    assert [r["id"] for r in rows] == ["7", "7"]           # same id: ingest keeps the first (duplicate_id)


def _unprivileged(fn, *args):
    """Run fn(*args) in a forked child without root's permission override (root reads mode-000 files)."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child():
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            q.put(("ok", fn(*args)))
        except BaseException as e:                          # noqa: BLE001 - reported to the parent
            q.put(("error", f"{type(e).__name__}: {e}"))

    p = ctx.Process(target=child)
    p.start()
    status, value = q.get(timeout=60)
    p.join(10)
    assert status == "ok", value
    return value


def _ingest_driver_and_reader(paths):
    files = readers.discover_files(paths)
    prints = [fingerprint(f.path) for f in files]
    rows, _ = _read([f.path for f in files])
    return [p["digest"] for p in prints], rows


def test_file_without_read_permission_is_an_unreadable_row():
    d = Path(tempfile.mkdtemp(prefix="purokit-perm-"))
    try:
        d.chmod(0o755)
        locked, good = d / "locked.jsonl", d / "good.jsonl"
        locked.write_bytes(_lines(3))
        good.write_bytes(_lines(2))
        locked.chmod(0o000)
        for p in (locked, good):
            os.chown(p, 0, 0)
        digests, rows = _unprivileged(_ingest_driver_and_reader, [str(d)])
        assert len(digests) == 2                           # fingerprinting did not crash
        assert [r["reason"] for r in rows] == [None, None, "unreadable"]
        assert rows[2]["origin_file"] == str(locked) and "PermissionError" in rows[2]["detail"]
    finally:
        for p in d.iterdir():
            p.chmod(0o644)
            p.unlink()
        d.rmdir()
