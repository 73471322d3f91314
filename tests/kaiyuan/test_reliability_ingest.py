"""Issue 21 (ingest, on real Spark): damaged and odd files are quarantined per file and the job goes
on with the other files and sources."""

import json

import pyarrow.parquet as pq
import pytest
import zstandard

from purokit.component import Component
from kaiyuan.config import RunConfig
from kaiyuan.spark.ingest import run_ingest


def _lines(n, prefix):
    return b"".join(json.dumps({"id": f"{prefix}{i}", "text": f"document {i} of {prefix}"}).encode() + b"\n"
                    for i in range(n))


@pytest.mark.slow
def test_ingest_goes_on_past_damaged_files_and_sources(tmp_path, spark):
    broken = tmp_path / "broken" / "a.jsonl.zst"
    broken.parent.mkdir()
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(_lines(300, "z")))
    data[len(data) // 2] ^= 0x10
    broken.write_bytes(bytes(data))
    d = tmp_path / "mixed"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"id": 7, "text": "int id", "w": 1e400}\n'
                                          + b'{"id": "7", "text": "string id"}\n' + _lines(3, "m"))
    (d / "sub" / "fake.parquet").write_bytes(b"PAR1 not really")
    (d / "sub" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    sources = [{"name": "broken", "paths": [str(broken)], "id_field": "id"},
               {"name": "plain", "paths": [str(d)], "id_field": "id"},
               {"name": "globbed", "paths": [str(d / "**" / "*.jsonl"), str(d / "**" / "*.parquet")],
                "id_field": "id"}]
    cfg = RunConfig.model_validate({"output": str(tmp_path / "out"), "sources": sources})
    out = run_ingest(spark, cfg)
    assert set(out) == {"broken", "plain", "globbed"}
    b = out["broken"]
    assert b.n_docs == 0 and set(b.counts["quarantine_reasons"]) == {"corrupt_archive"}
    q = pq.read_table(cfg.stage_dir("ingest") / "broken" / "_quarantine").to_pylist()
    assert all(r["origin_file"] == str(broken) for r in q) and "zstd frame 0" in q[-1]["detail"]
    for name in ("plain", "globbed"):        # a directory and a glob of it: the same outcome
        m = out[name]
        assert m.n_docs == 4, m.counts
        assert m.counts["quarantine_reasons"] == {"duplicate_id": 1, "unreadable": 1}
        docs = Component.open(cfg.stage_dir("ingest") / name).read().to_pylist()
        first = next(r for r in docs if r["id"] == "7")
        assert first["text"] == "int id" and dict(first["meta"]) == {"w": "1e400"}
        rows = pq.read_table(cfg.stage_dir("ingest") / name / "_quarantine").to_pylist()
        unreadable = next(r for r in rows if r["reason"] == "unreadable")
        assert unreadable["origin_file"].endswith("fake.parquet") and "fake.parquet" in unreadable["detail"]
        dup = next(r for r in rows if r["reason"] == "duplicate_id")
        assert dup["origin_line"] == 2 and "bom.jsonl:1" in dup["detail"]
