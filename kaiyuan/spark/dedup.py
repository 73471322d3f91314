"""The dedup job: exact + MinHash-LSH near-duplicate removal, within each source (Puro §3.6.2:
"We do not deduplicate across sources") or across sources (`dedup.scope: global`).

Steps (all in Spark; nothing proportional to the corpus is collected on the driver):
1. signatures: one vectorized pass (`mapInArrow`) over every document computes its exact key
   (`kaiyuan.exact`) and its band keys (`kaiyuan.minhash`).
2. edges: documents sharing an exact key, or a band key in the same band, are joined to the
   smallest node of that group (a star per bucket); optionally, near-duplicate edges whose
   signature-estimated Jaccard is below `verify.threshold` are dropped.
3. clusters: connected components of all edges (`kaiyuan.spark.connected`).
4. representatives: one per cluster (`kaiyuan.representative`); survivors keep `dup_cluster`
   ("<source>/<id>" of the cluster's smallest member) and `dup_count` (documents it stands for:
   the sum of the members' earlier `dup_count`, or 1 each).
5. per source: survivors are joined back to the documents and written as a component; removed
   ids go to `_removed/` with their cluster and whether the match was exact or near.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from common import atomic
from common.component import Component, ComponentManifest
from common.document import spark_col
from common.log import get_logger
from common.manifest import Stopwatch, find_complete
from kaiyuan.config import RunConfig
from kaiyuan.spark import components_io as cio
from kaiyuan.spark.connected import star_components

log = get_logger("kaiyuan.dedup")

JOB = "kaiyuan.dedup"
NODE_SEP = "\x1f"


def job_config(cfg: RunConfig) -> dict[str, Any]:
    d = cfg.dedup.model_dump(mode="json")
    d.pop("input_dir", None)
    bands, rows, num_perm = cfg.dedup.minhash.resolved()
    return {"job": JOB, "dedup": d, "resolved": {"bands": bands, "rows": rows, "num_perm": num_perm}}


def signature_fn(n_grams: int, shingles: str, bands: int, rows: int, num_perm: int, seed: int,
                 exact: bool, near: bool, keep_sig: bool):
    """The per-batch function of step 1: Arrow batch (source, id, text, ...) -> same columns
    without text, plus exact_key, bands (null for documents without tokens) and optionally sig."""

    def run(batches):
        import numpy as np
        import pyarrow as pa

        from kaiyuan import exact as ex
        from kaiyuan import minhash as mh

        a, b = mh.permutations(num_perm, seed)
        for batch in batches:
            texts = batch.column("text")
            cols = {n: batch.column(n) for n in batch.schema.names if n != "text"}
            n = batch.num_rows
            if exact:
                cols["exact_key"] = pa.array(ex.exact_keys(texts.to_pylist()), type=pa.binary())
            else:
                cols["exact_key"] = pa.nulls(n, pa.binary())
            if near:
                sh = mh.document_shingles(texts, n_grams, shingles)
                sig = mh.signatures(sh, a, b)
                keys = mh.band_keys(sig, bands, rows)
                has = sh.lengths > 0
                offsets = np.zeros(n + 1, dtype=np.int32)
                np.cumsum(np.where(has, bands, 0), out=offsets[1:])
                cols["bands"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(keys[has].reshape(-1)),
                                                         mask=pa.array(~has))
                if keep_sig:
                    k = sig.shape[1]
                    sig_offsets = np.zeros(n + 1, dtype=np.int32)
                    np.cumsum(np.where(has, k, 0), out=sig_offsets[1:])
                    cols["sig"] = pa.ListArray.from_arrays(pa.array(sig_offsets), pa.array(sig[has].view(np.int64).reshape(-1)),
                                                           mask=pa.array(~has))
            else:
                cols["bands"] = pa.nulls(n, pa.list_(pa.int64()))
            if keep_sig and "sig" not in cols:
                cols["sig"] = pa.nulls(n, pa.list_(pa.int64()))
            yield pa.RecordBatch.from_pydict(cols)

    return run


def estimated_jaccard(sig_a, sig_b, num_perm: int):
    """Column: fraction of equal MinHash values of two signature arrays (JVM-side, no Python)."""
    from pyspark.sql import functions as F

    equal = F.zip_with(sig_a, sig_b, lambda x, y: (x == y).cast("int"))
    return F.aggregate(equal, F.lit(0), lambda acc, v: acc + v) / F.lit(float(num_perm))


def _representative_order(cfg: RunConfig):
    from pyspark.sql import functions as F

    rep = cfg.dedup.representative
    if rep.by == "id":
        return [F.col("node").asc()]
    score = F.col("_score")
    key = score.desc_nulls_last() if rep.higher_is_better else score.asc_nulls_last()
    return [F.when(F.isnan(score), None).otherwise(score).isNull().asc(), key, F.col("node").asc()]


def dedup_units(cfg: RunConfig, components: dict[str, Component]) -> list[list[str]]:
    """Groups of sources computed together: one per source, or all of them for global scope."""
    names = sorted(components)
    return [names] if cfg.dedup.scope == "global" else [[n] for n in names]


def run_dedup(spark, cfg: RunConfig, only: Optional[list[str]] = None) -> dict[str, ComponentManifest]:
    stage = cfg.stage_dir("dedup")
    components = cio.require_components(cfg.dedup_input_dir(), only)
    config = job_config(cfg)
    results: dict[str, ComponentManifest] = {}
    todo: list[str] = []
    for unit in dedup_units(cfg, components):
        inputs = [cio.component_fingerprint(components[n]) for n in unit]
        found = {n: find_complete(stage / n, ComponentManifest, config, inputs) for n in unit}
        if all(found.values()):
            for n, m in found.items():
                log.info("dedup %s: complete (%d -> %d docs), skipped", n, m.counts.get("docs_in", 0), m.n_docs)
                results[n] = m
        else:
            todo.extend(unit)
    if todo:
        atomic.clean_stale_tmp(stage)
        results.update(_dedup(spark, cfg, {n: components[n] for n in todo}, config))
    return results


def _dedup(spark, cfg: RunConfig, components: dict[str, Component], config: dict[str, Any]) -> dict[str, ComponentManifest]:
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = cfg.dedup
    bands, rows, num_perm = d.minhash.resolved()
    stage = cfg.stage_dir("dedup")
    sw = Stopwatch()
    scope = ["source"] if d.scope == "source" else []
    rep = d.representative
    names = sorted(components)
    log.info("dedup %s: exact=%s near=%s scope=%s, %d-gram %s shingles, %d bands x %d rows (threshold ~%.2f)",
             ",".join(names), d.exact, d.near, d.scope, d.minhash.n_grams, d.minhash.shingles, bands, rows,
             (1 / bands) ** (1 / rows))

    # ---- 1. signatures ------------------------------------------------------------------------
    frames = []
    for n in names:
        c = components[n]
        df = cio.read_component(spark, c)
        if rep.by == "score":
            c.require_column(rep.column, "dedup.representative.column")
        cols = [F.col("source"), F.col("id"), F.col("text"),
                (F.col(spark_col(rep.column)).cast("double") if rep.by == "score" else F.lit(None).cast("double")).alias("_score"),
                (F.col("dup_count").cast("long") if "dup_count" in c.columns else F.lit(1).cast("long")).alias("_weight")]
        frames.append(df.select(*cols))
    docs = frames[0]
    for f in frames[1:]:
        docs = docs.unionByName(f)
    schema = ("source string, id string, _score double, _weight bigint, exact_key binary, bands array<bigint>"
              + (", sig array<bigint>" if d.verify.enabled else ""))
    keyed = (docs.mapInArrow(signature_fn(d.minhash.n_grams, d.minhash.shingles, bands, rows, num_perm, d.minhash.seed,
                                          d.exact, d.near, d.verify.enabled), schema)
             .withColumn("node", F.concat_ws(NODE_SEP, "source", "id"))
             .persist(StorageLevel.MEMORY_AND_DISK))
    with sw("signatures"):
        n_docs = keyed.count()
    log.info("dedup: signatures of %d documents in %.1fs", n_docs, sw.timings_s["signatures"])

    # ---- 2. edges -----------------------------------------------------------------------------
    edge_frames = []
    if d.exact:
        w = Window.partitionBy(*scope, "exact_key")
        edge_frames.append(keyed.select(F.col("node").alias("src"), F.min("node").over(w).alias("dst")))
    if d.near:
        exploded = keyed.where(F.col("bands").isNotNull()).select(*scope, "node", F.posexplode("bands").alias("band", "key"))
        wb = Window.partitionBy(*scope, "band", "key")
        near = exploded.select(F.col("node").alias("src"), F.min("node").over(wb).alias("dst")).where(F.col("src") != F.col("dst"))
        if d.verify.enabled:
            sigs = keyed.select("node", "sig")
            near = (near.distinct()
                    .join(sigs.withColumnRenamed("node", "src").withColumnRenamed("sig", "sig_a"), "src")
                    .join(sigs.withColumnRenamed("node", "dst").withColumnRenamed("sig", "sig_b"), "dst")
                    .where(estimated_jaccard(F.col("sig_a"), F.col("sig_b"), num_perm) >= d.verify.threshold)
                    .select("src", "dst"))
        edge_frames.append(near)
    if not edge_frames:
        raise ValueError("dedup.exact and dedup.near are both false: nothing to do")
    edges = edge_frames[0]
    for e in edge_frames[1:]:
        edges = edges.unionByName(e)
    with sw("clusters"):
        labels, rounds = star_components(edges.where(F.col("src") != F.col("dst")), d.max_cc_rounds,
                                         reliable_checkpoint=bool(cfg.spark.checkpoint_dir))
    log.info("dedup: connected components in %d rounds, %.1fs", rounds, sw.timings_s["clusters"])

    # ---- 3. representatives -------------------------------------------------------------------
    with sw("representatives"):
        wc = Window.partitionBy("root")
        assigned = (keyed.select("source", "id", "node", "exact_key", "_score", "_weight")
                    .join(labels, "node", "left")
                    .withColumn("root", F.coalesce("root", "node"))
                    .withColumn("_rank", F.row_number().over(wc.orderBy(*_representative_order(cfg))))
                    .withColumn("keep", F.col("_rank") == 1)
                    .withColumn("dup_count", F.sum("_weight").over(wc))
                    .withColumn("_size", F.count("*").over(wc))
                    .withColumn("_rep_key", F.max(F.when(F.col("keep"), F.col("exact_key"))).over(wc))
                    .withColumn("kind", F.when(F.col("keep"), F.lit(None))
                                .when(F.col("exact_key") == F.col("_rep_key"), F.lit("exact")).otherwise(F.lit("near")))
                    .withColumn("dup_cluster", F.regexp_replace("root", NODE_SEP, "/"))
                    .select("source", "id", "keep", "kind", "dup_cluster", "dup_count", "_size")
                    .persist(StorageLevel.MEMORY_AND_DISK))
        stats = {r["source"]: r.asDict() for r in assigned.groupBy("source").agg(
            F.count("*").alias("docs_in"),
            F.sum(F.col("keep").cast("long")).alias("docs_out"),
            F.sum((F.col("kind") == "exact").cast("long")).alias("removed_exact"),
            F.sum((F.col("kind") == "near").cast("long")).alias("removed_near"),
            F.sum((F.col("keep") & (F.col("_size") > 1)).cast("long")).alias("clusters"),
            F.max("_size").alias("largest_cluster"),
        ).collect()}
    keyed.unpersist()

    # ---- 4. write one component per source ----------------------------------------------------
    out: dict[str, ComponentManifest] = {}
    for n in names:
        c = components[n]
        final_dir = stage / n
        tmp = cio.new_tmp_dir(final_dir)
        with sw(f"write.{n}"):
            docs_n = cio.read_component(spark, c)
            keep_cols = [spark_col(x) for x in docs_n.columns if x not in ("dup_cluster", "dup_count")]
            mine = assigned.where(F.col("source") == n)
            survivors = (docs_n.select(*keep_cols)
                         .join(mine.where("keep").select("id", "dup_cluster", "dup_count"), "id", "inner"))
            survivors = survivors.select(*[spark_col(x) for x in docs_n.columns if x not in ("dup_cluster", "dup_count")],
                                         "dup_cluster", "dup_count")
            n_files = cio.n_files_for(sum(f.n_bytes for f in c.manifest.files), d.target_file_mb)
            cio.write_sorted_parquet(survivors, tmp, n_files, row_group_rows=cio.row_group_rows_for(
                sum(f.n_bytes for f in c.manifest.files) * 3, c.manifest.n_docs))
            removed = mine.where(~F.col("keep")).select("id", "dup_cluster", "kind")
            s = stats.get(n, {})
            outputs = []
            if s.get("docs_in", 0) - s.get("docs_out", 0) > 0:
                cio.write_sorted_parquet(removed, tmp / "_removed", max(1, n_files // 8))
                outputs.append("_removed")
        counts = {k: int(s.get(k) or 0) for k in ("docs_in", "docs_out", "removed_exact", "removed_near", "clusters",
                                                  "largest_cluster")}
        counts["cc_rounds"] = rounds
        manifest = cio.finalize(tmp, final_dir, {
            "schema": ComponentManifest.SCHEMA, "job": JOB, "name": n, "config": config,
            "inputs": [cio.component_fingerprint(components[x]) for x in (names if d.scope == "global" else [n])],
            "counts": counts, "timings_s": sw.timings_s, "outputs": outputs,
            "n_tokens": None, "tokenizer": None,
            "license": c.manifest.license, "source_identifier": c.manifest.source_identifier,
            "source_revision": c.manifest.source_revision,
            "lineage": c.manifest.lineage + [_lineage_entry(c)],
        })
        if manifest.n_docs != counts["docs_out"]:
            raise RuntimeError(f"dedup {n}: wrote {manifest.n_docs} documents, expected {counts['docs_out']}")
        log.info("dedup %s: %d -> %d documents (%d exact, %d near duplicates; %d clusters, largest %d)", n,
                 counts["docs_in"], counts["docs_out"], counts["removed_exact"], counts["removed_near"],
                 counts["clusters"], counts["largest_cluster"])
        out[n] = manifest
    assigned.unpersist()
    return out


def _lineage_entry(c: Component) -> dict[str, Any]:
    m = c.manifest
    return {"job": m.job, "config_hash": m.config_hash, "code_version": m.code_version,
            "manifest": str(Path(c.directory) / "manifest.json"), "n_docs": m.n_docs}
