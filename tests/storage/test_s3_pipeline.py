"""kaiyuan and mixtures against a real S3 endpoint (moto on loopback): s3 -> s3 ingest (a bad record
quarantined with its origin file and line, byte-range splits), dedup, materialize s3 -> s3, and
`mixtures inspect --verify` on s3. The slow test runs the demo's stages (with scoring) both on local
disk and on s3 and compares every component and shard hash."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from purokit import storage
from purokit.component import Component
from kaiyuan.config import RunConfig
from kaiyuan.spark.dedup import run_dedup
from kaiyuan.spark.ingest import run_ingest
from kaiyuan.spark.score import run_score
from mixtures.materialize import materialize
from mixtures.shards import ShardSet
from mixtures.spec import parse_spec
from mixtures.tokenizers import train_bpe
from tests.kaiyuan.conftest import planted_corpus, write_jsonl

from .conftest import upload_tree

STAGES = ("ingest", "dedup", "score")


def _kaiyuan_config(src: str, out: str) -> RunConfig:
    join = storage.join
    return RunConfig.model_validate({
        "output": out,
        "sources": [{"name": "web", "paths": [join(src, "web")], "id_field": "id", "license": "cc-by"},
                    {"name": "notes", "paths": [join(src, "notes", "*.jsonl")], "id_field": "id"}],
        "ingest": {"split_bytes": 16_000},          # the web file is read as byte ranges
        "dedup": {"scope": "source", "minhash": {"n_grams": 5, "bands": 14, "rows": 8}},
        "score": {"rows_per_partition": 200, "annotators": [{"type": "datatrove", "filter": "gopher_repetition"},
                                                             {"type": "lid"}]},
    })


def _spec(components: dict[str, str], tokenizer_json) -> dict:
    return {
        "name": "s3", "tokenizer": {"kind": "hf", "path": str(tokenizer_json)}, "seq_len": 32, "bucket_count": 3,
        "seeds": {"bucket_shuffle": 1, "uniform": 2, "replay": 3, "budget": 4, "holdout": 5},
        "holdout": {"fraction": 0.1},
        "components": [{"name": n, "path": p, "order_seed": 7} for n, p in sorted(components.items())],
        "phases": [{"name": "p1", "orders": ["uniform"], "components": {"web": 0.7, "notes": 0.3}}],
    }


def _file_hashes(c: Component) -> dict[str, str]:
    return {f.path: f.sha256 for f in c.manifest.files}


def _corpus(tmp) -> dict:
    """Two jsonl sources with planted near-duplicates and one malformed record; returns the good records."""
    web, _ = planted_corpus(1, 50, 5, prefix="w")
    notes, _ = planted_corpus(2, 20, 2, prefix="n")
    path = write_jsonl(tmp / "raw" / "web" / "part1.jsonl", web[:40])
    with open(path, "ab") as fh:
        fh.write(b'{"id": "w-bad", "text": "broken\n')                    # malformed: quarantined
    write_jsonl(tmp / "raw" / "web" / "part2.jsonl", web[40:])
    write_jsonl(tmp / "raw" / "notes" / "a.jsonl", notes)
    train_bpe([r["text"] for r in web + notes], 320, tmp / "tok", name="s3-bpe")
    return {"web": web, "notes": notes, "tokenizer": tmp / "tok" / "tokenizer.json"}


def _run(spark, src: str, out: str, sets_out: str, tokenizer_json, stages=STAGES) -> dict:
    """kaiyuan's stages, then mixtures materialize of the last stage's components."""
    cfg = _kaiyuan_config(src, out)
    run = {"cfg": cfg}
    jobs = {"ingest": run_ingest, "dedup": run_dedup, "score": run_score}
    for stage in stages:
        run[stage] = jobs[stage](spark, cfg)
    comps = {n: storage.join(out, stages[-1], n) for n in ("web", "notes")}
    run["sets"] = materialize(parse_spec(_spec(comps, tokenizer_json)), sets_out, progress=lambda m: None)
    return run


def _spark(env):
    from tests.kaiyuan.conftest import _live_session

    spark = _live_session()
    spark.sparkContext.environment.update(env)
    return spark


@pytest.fixture(scope="module")
def s3_run(tmp_path_factory, s3_server):
    """ingest and dedup s3 -> s3, then materialize s3 -> s3."""
    tmp = tmp_path_factory.mktemp("s3run")
    corpus = _corpus(tmp)
    fs, _ = storage.filesystem("s3://purokit-run")
    fs.mkdir("purokit-run")
    upload_tree(tmp / "raw", "s3://purokit-run/raw")
    run = _run(_spark(s3_server), "s3://purokit-run/raw", "s3://purokit-run/out", "s3://purokit-run/shards",
               corpus["tokenizer"], stages=("ingest", "dedup"))
    return {**run, "corpus": corpus}


def test_quarantine_on_s3_names_origin_and_line(s3_run):
    m = s3_run["ingest"]["web"]
    assert m.counts["quarantine_reasons"] == {"malformed_json": 1}
    assert m.counts["splits"] > m.counts["files"]                 # byte ranges of the web files were the splits
    c = Component.open("s3://purokit-run/out/ingest/web", verify_hashes=True)
    assert storage.is_remote(c.directory) and c.directory.name.startswith(storage.ATTEMPT_PREFIX)
    fs, inner = storage.arrow_filesystem(storage.join(c.directory, "_quarantine"))
    q = pq.read_table(inner, filesystem=fs).to_pylist()
    assert [(r["origin_file"], r["origin_line"], r["reason"]) for r in q] == [
        ("s3://purokit-run/raw/web/part1.jsonl", 41, "malformed_json")]
    d = Component.open("s3://purokit-run/out/dedup/web")
    assert d.manifest.n_docs < c.manifest.n_docs == len(s3_run["corpus"]["web"])   # planted near-duplicates removed


def test_materialize_and_inspect_verify_on_s3(s3_run):
    sets = s3_run["sets"]
    assert sorted(sets) == ["eval", "p1-uniform"]
    assert storage.has_committed("s3://purokit-run/shards/p1-uniform", "manifest.json")
    staged = ShardSet.open("s3://purokit-run/shards/p1-uniform", verify_hashes=True)
    assert staged.n_tokens == sets["p1-uniform"].n_tokens and staged.directory.is_relative_to(storage.cache_root())
    proc = subprocess.run([sys.executable, "-m", "mixtures", "inspect", "s3://purokit-run/shards", "--verify"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "p1-uniform:" in proc.stdout and "eval:" in proc.stdout and "every file matches its sha256" in proc.stdout


def test_rerun_on_s3_is_skipped_from_committed_manifests(s3_run):
    from tests.kaiyuan.conftest import _live_session

    again = run_ingest(_live_session(), s3_run["cfg"])
    assert {n: m.created_at for n, m in again.items()} == {n: m.created_at for n, m in s3_run["ingest"].items()}
    listing = [rel for rel, _, _ in storage.list_files("s3://purokit-run/out/ingest", hidden=True)]
    assert len({rel.split("/")[1] for rel in listing if rel.split("/")[1].startswith("_attempt-")}) == 2
    record = json.loads(storage.path("s3://purokit-run/out/ingest/web/_commit.json").read_text())
    assert record["schema"] == "commit/1" and {f["path"] for f in record["files"]} >= {"manifest.json", "part-00000.parquet"}


@pytest.mark.slow
def test_demo_stages_on_s3_give_the_local_hashes(tmp_path, s3_server):
    """The demo's kaiyuan stages (ingest, dedup, score) and mixtures materialize on local disk and on
    s3: every component file and every shard has the same sha256."""
    tok = _corpus(tmp_path)["tokenizer"]
    fs, _ = storage.filesystem("s3://purokit-same")
    fs.mkdir("purokit-same")
    upload_tree(tmp_path / "raw", "s3://purokit-same/raw")
    spark = _spark(s3_server)
    local = _run(spark, str(tmp_path / "raw"), str(tmp_path / "out"), str(tmp_path / "shards"), tok)
    remote = _run(spark, "s3://purokit-same/raw", "s3://purokit-same/out", "s3://purokit-same/shards", tok)
    for stage in STAGES:
        for name in ("web", "notes"):
            a = Component.open(storage.join(local["cfg"].output, stage, name))
            b = Component.open(storage.join(remote["cfg"].output, stage, name), verify_hashes=True)
            ta, tb = a.read(), b.read()
            assert tb.schema.equals(ta.schema, check_metadata=True), (stage, name, ta.schema, tb.schema)
            assert [c for c in ta.column_names if not ta.column(c).equals(tb.column(c))] == [], (stage, name)
            assert _file_hashes(b) == _file_hashes(a), (stage, name)
            assert b.manifest.n_docs == a.manifest.n_docs and b.manifest.columns == a.manifest.columns
    assert sorted(remote["sets"]) == sorted(local["sets"]) == ["eval", "p1-uniform"]
    for name in local["sets"]:
        assert [s.sha256 for s in remote["sets"][name].shards] == [s.sha256 for s in local["sets"][name].shards]
        assert remote["sets"][name].set_digest == local["sets"][name].set_digest
