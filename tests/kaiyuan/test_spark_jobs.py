"""ingest -> dedup -> score on real Spark (local[2]), checked against direct computations."""

import hashlib
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purokit.component import Component
from purokit.document import schema_problems
from tests.kaiyuan import oracles
from kaiyuan.config import RunConfig
from kaiyuan.spark.connected import star_components
from kaiyuan.spark.dedup import run_dedup
from kaiyuan.spark.ingest import run_ingest
from kaiyuan.spark.score import run_score

from .conftest import planted_corpus, prose, write_jsonl


def _config(tmp_path, sources, **sections):
    return RunConfig.model_validate({"output": str(tmp_path / "out"), "sources": sources, **sections})


def _file_hashes(directory):
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    web, web_clusters = planted_corpus(1, 120, 15, prefix="w")
    bad = [b"{not json", b'{"id": "w-empty", "text": ""}', b'{"id": "w0001", "text": "reused id"}']
    path = write_jsonl(d / "web" / "part1.jsonl", web)
    with open(path, "ab") as fh:
        fh.write(b"\n".join(bad) + b"\n")
    books, book_clusters = planted_corpus(2, 40, 4, prefix="b")
    t = pa.table({"body": [r["text"] for r in books], "key": [r["id"] for r in books]})
    pq.write_table(t, d / "books.parquet", row_group_size=16)
    sources = [
        {"name": "web", "paths": [str(d / "web")], "id_field": "id", "license": "cc-by"},
        {"name": "books", "paths": [str(d / "books.parquet")], "text_field": "body", "id_field": "key"},
    ]
    return {"dir": d, "sources": sources, "web": web, "web_clusters": web_clusters,
            "books": books, "books_clusters": book_clusters}


@pytest.fixture(scope="module")
def pipeline_run(corpus, tmp_path_factory):
    from tests.kaiyuan.conftest import _live_session

    spark = _live_session()
    tmp = tmp_path_factory.mktemp("run")
    cfg = _config(tmp, corpus["sources"], score={"rows_per_partition": 60, "annotators": [
        {"type": "lid"},
        {"type": "datatrove", "filter": "gopher_quality"},
        {"type": "datatrove", "filter": "c4_quality", "sources": ["web"]},
    ]})
    ingest = run_ingest(spark, cfg)
    dedup = run_dedup(spark, cfg)
    score = run_score(spark, cfg)
    return {"cfg": cfg, "ingest": ingest, "dedup": dedup, "score": score}


def test_ingest_counts_and_quarantine(pipeline_run, corpus):
    m = pipeline_run["ingest"]["web"]
    assert m.n_docs == len(corpus["web"])
    assert m.counts["quarantine_reasons"] == {"duplicate_id": 1, "empty_text": 1, "malformed_json": 1}
    assert m.counts["records"] == len(corpus["web"]) + 3
    assert m.license == "cc-by"
    assert m.outputs == ["_quarantine"]
    c = Component.open(pipeline_run["cfg"].stage_dir("ingest") / "web", verify_hashes=True)
    q = pq.read_table(c.directory / "_quarantine").to_pylist()
    by_reason = {r["reason"]: r for r in q}
    n = len(corpus["web"])
    assert by_reason["malformed_json"]["origin_line"] == n + 1
    assert by_reason["empty_text"]["origin_line"] == n + 2
    assert by_reason["duplicate_id"]["origin_line"] == n + 3
    assert "first seen at" in by_reason["duplicate_id"]["detail"]
    kept = {r["id"]: r["text"] for r in c.read(["id", "text"]).to_pylist()}
    assert kept["w0001"] != "reused id"                # the first occurrence stays
    assert dict(c.read(["meta"]).to_pylist()[0]["meta"]).keys() <= {"url"}
    books = Component.open(pipeline_run["cfg"].stage_dir("ingest") / "books")
    assert books.manifest.n_docs == len(corpus["books"])
    assert schema_problems(books.dataset().schema) == []


def _clusters_of(component):
    rows = component.read(["id", "dup_cluster", "dup_count"]).to_pylist()
    removed = pq.read_table(component.directory / "_removed").to_pylist()
    members = {}
    for r in rows:
        members.setdefault(r["dup_cluster"], []).append(r["id"])
    for r in removed:
        members.setdefault(r["dup_cluster"], []).append(r["id"])
    return rows, removed, {k: sorted(v) for k, v in members.items()}


@pytest.mark.parametrize("source", ["web", "books"])
def test_dedup_finds_exactly_the_planted_clusters(pipeline_run, corpus, source):
    c = Component.open(pipeline_run["cfg"].stage_dir("dedup") / source, verify_hashes=True)
    rows, removed, members = _clusters_of(c)
    planted = corpus[f"{source}_clusters"]
    found = sorted(v for v in members.values() if len(v) > 1)
    assert found == sorted(planted)
    by_id = {r["id"]: r for r in rows}
    for cluster in planted:
        rep = cluster[0]                               # the smallest id survives
        assert by_id[rep]["dup_count"] == len(cluster)
        assert by_id[rep]["dup_cluster"] == f"{source}/{rep}"
        assert not any(m in by_id for m in cluster[1:])
    singletons = [r for r in rows if r["dup_count"] == 1]
    assert all(r["dup_cluster"] == f"{source}/{r['id']}" for r in singletons)
    kinds = {r["id"]: r["kind"] for r in removed}
    assert kinds[f"{source[0]}zz-exact"] == "exact"
    assert sum(k == "near" for k in kinds.values()) == sum(len(cl) - 1 for cl in planted) - 1
    m = pipeline_run["dedup"][source]
    assert m.counts["docs_in"] - m.counts["docs_out"] == len(removed)
    assert m.counts["clusters"] == len(planted)
    assert m.lineage[-1]["job"] == "kaiyuan.ingest"


def test_score_columns_equal_direct_datatrove_and_fasttext(pipeline_run):
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter
    from datatrove.pipeline.filters.base_filter import get_filter_result

    from kaiyuan.annotators.fasttext_models import bundled_lid_model, load_fasttext

    c = Component.open(pipeline_run["cfg"].stage_dir("score") / "web", verify_hashes=True)
    assert schema_problems(c.dataset().schema) == []
    t = c.read().to_pylist()
    assert {"filter.gopher_quality", "filter.gopher_quality.reason", "filter.c4_quality", "lang", "lang_score",
            "dup_cluster", "dup_count"} <= set(t[0])
    gq, c4 = GopherQualityFilter(), C4QualityFilter()
    lid = load_fasttext(bundled_lid_model())
    for row in t[:60]:
        ok, reason = get_filter_result(gq.filter(Document(text=row["text"], id=row["id"])))
        assert row["filter.gopher_quality"] == ok
        assert row["filter.gopher_quality.reason"] == (None if ok else reason)
        ok4, _ = get_filter_result(c4.filter(Document(text=row["text"], id=row["id"])))
        assert row["filter.c4_quality"] == ok4
        labels, probs = lid.predict([row["text"].replace("\n", " ")], k=1)
        assert row["lang"] == labels[0][0].removeprefix("__label__")
        assert row["lang_score"] == pytest.approx(float(probs[0][0]), rel=1e-6)
    books = Component.open(pipeline_run["cfg"].stage_dir("score") / "books")
    assert "filter.c4_quality" not in books.columns           # that annotator is for web only
    m = pipeline_run["score"]["web"]
    assert m.n_docs == pipeline_run["dedup"]["web"].n_docs
    gstats = m.counts["filters"]["gopher_quality"]
    assert gstats["pass"] + gstats["fail"] + gstats["error"] == m.n_docs
    assert gstats["pass"] == sum(r["filter.gopher_quality"] for r in t)
    assert m.counts["languages"]["en"] == sum(r["lang"] == "en" for r in t)


def test_rerun_skips_and_a_fresh_run_is_byte_identical(pipeline_run, corpus, spark, tmp_path):
    cfg = pipeline_run["cfg"]
    again = run_dedup(spark, cfg)
    assert {k: v.created_at for k, v in again.items()} == {k: v.created_at for k, v in pipeline_run["dedup"].items()}
    fresh = _config(tmp_path, corpus["sources"], score=cfg.score.model_dump())
    run_ingest(spark, fresh, only=["web"])
    run_dedup(spark, fresh, only=["web"])
    run_score(spark, fresh, only=["web"])
    for stage in ("ingest", "dedup", "score"):
        a, b = cfg.stage_dir(stage) / "web", fresh.stage_dir(stage) / "web"
        assert _file_hashes(a) == _file_hashes(b), stage
        assert Component.open(a).manifest.config_hash == Component.open(b).manifest.config_hash


def test_global_scope_clusters_across_sources_and_score_representatives(spark, tmp_path):
    rng = random.Random(4)
    shared = [prose(rng, 200) for _ in range(5)]
    a = [{"id": f"a{i}", "text": t, "q": 0.1} for i, t in enumerate(shared)] + [{"id": "a9", "text": prose(rng, 200), "q": 0.5}]
    b = [{"id": f"b{i}", "text": t, "q": 0.9} for i, t in enumerate(shared)]
    write_jsonl(tmp_path / "a.jsonl", a)
    write_jsonl(tmp_path / "b.jsonl", b)
    sources = [{"name": "a", "paths": [str(tmp_path / "a.jsonl")], "id_field": "id"},
               {"name": "b", "paths": [str(tmp_path / "b.jsonl")], "id_field": "id"}]
    cfg = _config(tmp_path, sources, dedup={"scope": "source"})
    run_ingest(spark, cfg)
    per_source = run_dedup(spark, cfg)
    assert per_source["a"].n_docs == 6 and per_source["b"].n_docs == 5     # the paper's default: no cross-source dedup
    # a score column to choose representatives by (as a component would carry quality.<name>)
    for name in ("a", "b"):
        comp = Component.open(cfg.stage_dir("ingest") / name)
        assert "meta" in comp.columns
    g = _config(tmp_path, sources, output=str(tmp_path / "global"),
                dedup={"scope": "global", "input_dir": str(cfg.stage_dir("ingest"))})
    out = run_dedup(spark, g)
    assert out["a"].n_docs + out["b"].n_docs == 6
    assert out["a"].n_docs == 6 and out["b"].n_docs == 0                   # "a/a0" < "b/b0": a wins by id
    rows = Component.open(g.stage_dir("dedup") / "a").read(["id", "dup_cluster", "dup_count"]).to_pylist()
    assert sorted(r["dup_count"] for r in rows) == [1, 2, 2, 2, 2, 2]
    # by score: materialize a score column from meta in a component and let the higher one win
    scored = tmp_path / "scored"
    for name in ("a", "b"):
        comp = Component.open(cfg.stage_dir("ingest") / name)
        df = spark.read.parquet(*map(str, comp.paths))
        from pyspark.sql import functions as F

        df = df.withColumn("quality.q", F.col("meta")["q"].cast("double"))
        from kaiyuan.spark import components_io as cio

        tmp = cio.new_tmp_dir(scored / name)
        cio.write_sorted_parquet(df, tmp, 1)
        cio.finalize(tmp, scored / name, {"job": "test", "name": name})
    s = _config(tmp_path, sources, output=str(tmp_path / "byscore"),
                dedup={"scope": "global", "input_dir": str(scored),
                       "representative": {"by": "score", "column": "quality.q"}})
    out = run_dedup(spark, s)
    assert out["a"].n_docs == 1 and out["b"].n_docs == 5                    # b's copies score higher
    rows = Component.open(s.stage_dir("dedup") / "b").read(["id", "dup_cluster", "dup_count"]).to_pylist()
    assert all(r["dup_cluster"].startswith("a/a") and r["dup_count"] == 2 for r in rows)


def test_verification_and_exact_only(spark, tmp_path, capsys):
    records, clusters = planted_corpus(9, 30, 5, prefix="v")
    write_jsonl(tmp_path / "v.jsonl", records)
    sources = [{"name": "v", "paths": [str(tmp_path / "v.jsonl")], "id_field": "id"}]
    cfg = _config(tmp_path, sources)
    run_ingest(spark, cfg)
    assert f"source 1/1 | ingested v: {len(records)} documents" in capsys.readouterr().out   # the one progress form
    strict = _config(tmp_path, sources, output=str(tmp_path / "strict"),
                     dedup={"input_dir": str(cfg.stage_dir("ingest")), "verify": {"enabled": True, "threshold": 0.999}})
    m = run_dedup(spark, strict)["v"]
    assert f"component 1/1 | deduplicated v: {len(records)} -> {len(records) - 1} documents" in capsys.readouterr().out
    assert m.counts["removed_near"] == 0 and m.counts["removed_exact"] == 1   # near pairs (J ~ 0.9) fail verification
    loose = _config(tmp_path, sources, output=str(tmp_path / "loose"),
                    dedup={"input_dir": str(cfg.stage_dir("ingest")), "verify": {"enabled": True, "threshold": 0.5}})
    m = run_dedup(spark, loose)["v"]
    assert m.counts["removed_near"] == sum(len(c) - 1 for c in clusters) - 1
    exact_only = _config(tmp_path, sources, output=str(tmp_path / "exact"),
                         dedup={"input_dir": str(cfg.stage_dir("ingest")), "near": False})
    m = run_dedup(spark, exact_only)["v"]
    assert (m.counts["removed_exact"], m.counts["removed_near"]) == (1, 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_spark_connected_components_equal_union_find(spark, seed):
    rng = random.Random(seed)
    edges = [(f"n{rng.randrange(400):04d}", f"n{rng.randrange(400):04d}") for _ in range(300)]
    chain = [f"c{i:04d}" for i in range(300)]
    rng.shuffle(chain)
    edges += list(zip(chain, chain[1:]))
    df = spark.createDataFrame(edges, "src string, dst string")
    labels, rounds = star_components(df)
    got = {r["node"]: r["root"] for r in labels.collect()}
    want = oracles.union_find_components(edges)
    want = {k: v for k, v in want.items() if any(k in e for e in edges if e[0] != e[1])}
    assert got == want
    assert rounds < 30
