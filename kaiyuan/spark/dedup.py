"""The dedup job: exact + MinHash-LSH near-duplicate removal, within each source (Puro §3.6.2:
"We do not deduplicate across sources") or across sources (`dedup.scope: global`).

Steps (all in Spark; nothing proportional to the corpus is collected on the driver):
1. signatures: one vectorized pass (`mapInArrow`) over every document computes its exact key
   (`kaiyuan.exact`) and its band keys (`kaiyuan.minhash`; bands and rows from `dedup.threshold`).
2. exact edges: every document to the smallest node with the same exact key. Only that smallest
   node of each exact group enters LSH (its copies follow it through the exact edge), so a
   thousand copies of one licence cost one LSH entry, not half a million candidate pairs.
3. candidate pairs from every LSH bucket (same band, same key): all pairs of a bucket of up to
   `verify.all_pairs_max` documents; in a larger bucket each member and the next `verify.window`
   members in the order of their band-key vectors (a sorted neighbourhood: documents equal in
   more bands sit next to each other), `window` pairs per member instead of n^2 / 2.
4. exact verification: the shingle-hash sets (`minhash.shingle_sets`) are recomputed for the
   documents in candidate pairs only (a semi-join of their text), joined to both ends of each
   pair, and `minhash.intersection_sizes` / `minhash.jaccard` keep the pairs with exact Jaccard
   >= the threshold. With `verify.enabled: false` step 3 and 4 become one unverified edge per
   bucket member to the bucket's smallest member (datatrove's and the LSH-only baseline).
5. clusters: connected components of the exact and verified edges only (`kaiyuan.spark.connected`).
6. representatives: one per cluster (smallest node, or best score then smallest node); survivors
   keep `dup_cluster` ("<source>/<id>" of the cluster's smallest member) and `dup_count`
   (documents it stands for: the sum of the members' earlier `dup_count`, or 1 each).
7. per source: survivors are joined back to the documents and written as a component; removed
   ids go to `_removed/` with their cluster, `kind` (exact | near), and the edge that removed
   them: `partner` ("<source>/<id>": the representative or the exact copy with the same
   normalized text, else the verified neighbour of highest Jaccard) and `jaccard` (1.0 for exact
   copies; null when verification is off).

Each step's result (signatures, candidate pairs, shingle sets, edges, assignments) is checkpointed
(`connected.materialize`), not cached: the plan of a cached DataFrame is repeated by every plan
that reads it, so the writes' plans grew with each step (29 MB of plan text for 41 documents; the
driver's heap overflowed building it on 8,000 man pages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from purokit.component import Component, ComponentManifest
from purokit.document import spark_col
from purokit.log import get_logger
from purokit.manifest import Stopwatch
from purokit.progress import Reporter
from kaiyuan import exact as ex
from kaiyuan import minhash as mh
from kaiyuan.config import RunConfig
from kaiyuan.spark import components_io as cio
from kaiyuan.spark.component_job import ComponentJob
from kaiyuan.spark.connected import materialize, star_components

log = get_logger("kaiyuan.dedup")

JOB = "kaiyuan.dedup"
NODE_SEP = "\x1f"


def job_config(cfg: RunConfig) -> dict[str, Any]:
    d = cfg.dedup.model_dump(mode="json")
    d.pop("input_dir", None)
    bands, rows, num_perm = cfg.dedup.lsh()
    return {"job": JOB, "dedup": d, "resolved": {"bands": bands, "rows": rows, "num_perm": num_perm,
                                                 "verify_threshold": cfg.dedup.verify_threshold}}


# ---- Arrow <-> Ragged ------------------------------------------------------------------------

def ragged_of(lists: pa.Array | pa.ChunkedArray) -> mh.Ragged:
    """An Arrow list<int64> column (nulls as empty lists) as a Ragged of uint64."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.int64, copy=False).view(np.uint64)
    return mh.Ragged(values, lengths)


def list_array_of(values: np.ndarray, lengths: np.ndarray, null: Optional[np.ndarray] = None) -> pa.ListArray:
    """Ragged uint64 values as an Arrow list<int64> column (`null`: rows to mark null)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ascontiguousarray(values).view(np.int64)),
                                    mask=None if null is None else pa.array(null))


# ---- the per-batch functions (pure; Spark runs them in mapInArrow) -------------------------

def signature_fn(n_grams: int, shingles: str, bands: int, rows: int, num_perm: int, seed: int,
                 exact: bool, near: bool):
    """Step 1: Arrow batch (source, id, text, ...) -> same columns without text, plus exact_key,
    bands (null for documents without tokens) and n_sh (distinct shingles)."""

    def run(batches):
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
                keys = mh.band_keys(mh.signatures(sh, a, b), bands, rows)
                has = sh.lengths > 0
                cols["bands"] = list_array_of(keys[has].reshape(-1).view(np.uint64), np.where(has, bands, 0), ~has)
                cols["n_sh"] = pa.array(mh.shingle_sets(sh).lengths, type=pa.int64())
            else:
                cols["bands"] = pa.nulls(n, pa.list_(pa.int64()))
                cols["n_sh"] = pa.nulls(n, pa.int64())
            yield pa.RecordBatch.from_pydict(cols)

    return run


def shingle_set_fn(n_grams: int, shingles: str):
    """Step 4: (node, text) -> (node, sh): each document's shingle-hash set, sorted."""

    def run(batches):
        for batch in batches:
            sets = mh.shingle_sets(mh.document_shingles(batch.column("text"), n_grams, shingles))
            yield pa.RecordBatch.from_pydict({"node": batch.column("node"),
                                              "sh": list_array_of(sets.values, sets.lengths)})

    return run


def verify_fn(threshold: float):
    """Step 4: (src, dst, sh_a, sh_b) -> (src, dst, jaccard) for the pairs with exact Jaccard >= threshold."""

    def run(batches):
        for batch in batches:
            a, b = ragged_of(batch.column("sh_a")), ragged_of(batch.column("sh_b"))
            j = mh.jaccard(mh.intersection_sizes(a, b), a.lengths, b.lengths)
            keep = pa.array(j >= threshold)
            yield pa.RecordBatch.from_pydict({"src": batch.column("src").filter(keep),
                                              "dst": batch.column("dst").filter(keep),
                                              "jaccard": pa.array(j).filter(keep)})

    return run


# ---- candidate pairs -----------------------------------------------------------------------

def bucket_pairs(lsh_docs, scope: list[str], all_pairs_max: int, window: int, threshold: float = 0.0):
    """Step 3: distinct candidate pairs (src, dst), src > dst, from the LSH buckets of `lsh_docs`
    (node, bands, n_sh, scope columns): all pairs of small buckets, a sorted neighbourhood in big
    ones; pairs whose set sizes alone rule out J >= threshold (min/max < threshold) are dropped."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    bucket = [*scope, "band", "key"]
    exploded = lsh_docs.select(*scope, "node", "n_sh", F.posexplode("bands").alias("band", "key"))
    sized = (exploded.withColumn("_n", F.count("*").over(Window.partitionBy(*bucket))).where(F.col("_n") > 1)
             .persist(StorageLevel.MEMORY_AND_DISK))
    def sizes_allow(n_a, n_b):
        return F.least(n_a, n_b) >= F.lit(threshold) * F.greatest(n_a, n_b) - F.lit(1e-9)   # J <= min/max

    small = sized.where(F.col("_n") <= all_pairs_max).select(*bucket, "node", "n_sh")
    pairs = (small.join(small.select(*bucket, F.col("node").alias("other"), F.col("n_sh").alias("n_other")), bucket)
             .where((F.col("node") > F.col("other")) & sizes_allow(F.col("n_sh"), F.col("n_other")))
             .select(F.col("node").alias("src"), F.col("other").alias("dst")))
    big = (sized.where(F.col("_n") > all_pairs_max).select(*bucket, "node", "n_sh")
           .join(lsh_docs.select("node", F.col("bands").alias("_order")), "node")
           .withColumn("_rank", F.row_number().over(Window.partitionBy(*bucket).orderBy("_order", "node")))
           .select(*bucket, "node", "n_sh", "_rank"))
    ahead = big.select(*bucket, F.col("node").alias("a"), F.col("n_sh").alias("n_a"),
                       F.explode(F.sequence(F.col("_rank") + 1, F.col("_rank") + window)).alias("_rank"))
    near_by = (ahead.join(big.select(*bucket, "_rank", F.col("node").alias("b"), F.col("n_sh").alias("n_b")), [*bucket, "_rank"])
               .where(sizes_allow(F.col("n_a"), F.col("n_b"))))
    pairs = pairs.unionByName(near_by.select(F.greatest("a", "b").alias("src"), F.least("a", "b").alias("dst")))
    return pairs.distinct(), sized


def star_pairs(lsh_docs, scope: list[str]):
    """Unverified edges: every bucket member to the bucket's smallest member (`verify.enabled: false`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    exploded = lsh_docs.select(*scope, "node", F.posexplode("bands").alias("band", "key"))
    wb = Window.partitionBy(*scope, "band", "key")
    return (exploded.select(F.col("node").alias("src"), F.min("node").over(wb).alias("dst"))
            .where(F.col("src") != F.col("dst")).distinct())


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
    job = ComponentJob(JOB, cfg.stage_dir("dedup"))
    components = cio.require_components(cfg.dedup_input_dir(), only)
    config = job_config(cfg)
    results: dict[str, ComponentManifest] = {}
    todo: list[str] = []
    for unit in dedup_units(cfg, components):
        inputs = [cio.component_fingerprint(components[n]) for n in unit]
        found = {n: job.complete(n, config, inputs) for n in unit}
        if all(found.values()):
            results.update(found)
        else:
            todo.extend(unit)
    if todo:
        job.clean_stale()
        results.update(_dedup(spark, cfg, job, {n: components[n] for n in todo}, config))
    return results


@dataclass
class DedupPass:
    """What the steps of one dedup pass share: the settings, whether checkpoints are reliable, the
    scope columns, the step timings and the counts that go into every manifest of the pass."""

    cfg: RunConfig
    reliable: bool
    scope: list[str]
    sw: Stopwatch = field(default_factory=Stopwatch)
    counts: dict[str, int] = field(default_factory=dict)     # candidate pairs and documents, verified pairs
    rounds: int = 0                                          # of the connected components

    @classmethod
    def of(cls, cfg: RunConfig) -> "DedupPass":
        return cls(cfg, bool(cfg.spark.checkpoint_dir), ["source"] if cfg.dedup.scope == "source" else [])


def _dedup(spark, cfg: RunConfig, job: ComponentJob, components: dict[str, Component],
           config: dict[str, Any]) -> dict[str, ComponentManifest]:
    """The numbered steps of the module docstring, one function each."""
    d, run = cfg.dedup, DedupPass.of(cfg)
    bands, rows, _ = d.lsh()
    log.info("dedup %s: exact=%s near=%s scope=%s, %d-gram %s shingles, %d bands x %d rows for J >= %.2f, verify=%s",
             ",".join(sorted(components)), d.exact, d.near, d.scope, d.minhash.n_grams, d.minhash.shingles, bands, rows,
             d.threshold, f"exact J >= {d.verify_threshold:.2f}" if d.verify.enabled else "off")
    if not (d.exact or d.near):
        raise ValueError("dedup.exact and dedup.near are both false: nothing to do")
    docs = documents(spark, cfg, components)
    keyed = signatures(docs, run)
    near = near_edges(docs, keyed, run) if d.near else None
    labels = clusters(keyed, near, run)
    assigned, stats = representatives(keyed, labels, near, run)
    return write_components(spark, job, components, assigned, stats, config, run)


# ---- 1. signatures --------------------------------------------------------------------------

def documents(spark, cfg: RunConfig, components: dict[str, Component]):
    """The documents of every component in the pass: source, id, text, the representative's score
    (`_score`, null unless `representative.by: score`) and the documents each stands for (`_weight`)."""
    from pyspark.sql import functions as F

    rep = cfg.dedup.representative
    frames = []
    for n in sorted(components):
        c = components[n]
        if rep.by == "score":
            c.require_column(rep.column, "dedup.representative.column")
        score = F.col(spark_col(rep.column)).cast("double") if rep.by == "score" else F.lit(None).cast("double")
        weight = F.col("dup_count").cast("long") if "dup_count" in c.columns else F.lit(1).cast("long")
        frames.append(cio.read_component(spark, c).select(F.col("source"), F.col("id"), F.col("text"),
                                                          score.alias("_score"), weight.alias("_weight")))
    docs = frames[0]
    for f in frames[1:]:
        docs = docs.unionByName(f)
    return docs


def signatures(docs, run: DedupPass):
    """Steps 1-2: each document's exact key, band keys and shingle count (`signature_fn`), its node
    ("<source>\\x1f<id>") and `_exact_root`, the smallest node with the same normalized text (the node
    itself without exact dedup); checkpointed."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d = run.cfg.dedup
    bands, rows, num_perm = d.lsh()
    schema = "source string, id string, _score double, _weight bigint, exact_key binary, bands array<bigint>, n_sh bigint"
    keyed = docs.mapInArrow(signature_fn(d.minhash.n_grams, d.minhash.shingles, bands, rows, num_perm, d.minhash.seed,
                                         d.exact, d.near), schema).withColumn("node", F.concat_ws(NODE_SEP, "source", "id"))
    exact_root = F.min("node").over(Window.partitionBy(*run.scope, "exact_key")) if d.exact else F.col("node")
    with run.sw("signatures"):
        keyed = materialize(keyed.withColumn("_exact_root", exact_root), run.reliable)
        n_docs = keyed.count()
    log.info("dedup: signatures of %d documents in %.1fs", n_docs, run.sw.timings_s["signatures"])
    return keyed


# ---- 3.-4. candidate pairs and verified edges ---------------------------------------------------

def near_edges(docs, keyed, run: DedupPass):
    """Near-duplicate edges (src, dst, jaccard) among the exact groups' roots that have tokens:
    verified candidate pairs, or with `verify.enabled: false` unverified star edges (jaccard null)."""
    from pyspark.sql import functions as F

    lsh_docs = (keyed.where(F.col("bands").isNotNull() & (F.col("node") == F.col("_exact_root")))
                .select(*run.scope, "node", "bands", "n_sh"))
    if not run.cfg.dedup.verify.enabled:
        near = star_pairs(lsh_docs, run.scope).withColumn("jaccard", F.lit(None).cast("double"))
        with run.sw("candidates"):
            near = materialize(near, run.reliable)
            run.counts["candidate_pairs"] = near.count()
        return near
    return verified_edges(docs, candidate_pairs(lsh_docs, run), run)


def candidate_pairs(lsh_docs, run: DedupPass):
    """Step 3: the distinct candidate pairs of the LSH buckets (`bucket_pairs`); checkpointed."""
    v = run.cfg.dedup.verify
    pairs, sized = bucket_pairs(lsh_docs, run.scope, v.all_pairs_max, v.window, run.cfg.dedup.verify_threshold)
    with run.sw("candidates"):
        pairs = materialize(pairs, run.reliable)
        run.counts["candidate_pairs"] = pairs.count()
    sized.unpersist()
    return pairs


def verified_edges(docs, pairs, run: DedupPass):
    """Step 4: the candidate pairs whose exact Jaccard of shingle sets reaches the threshold; the sets
    are computed for the documents in candidate pairs only."""
    from pyspark.sql import functions as F

    d, threshold = run.cfg.dedup, run.cfg.dedup.verify_threshold
    ends = pairs.select(F.col("src").alias("node")).unionByName(pairs.select(F.col("dst").alias("node"))).distinct()
    texts = docs.select(F.concat_ws(NODE_SEP, "source", "id").alias("node"), "text").join(ends, "node", "left_semi")
    sets = texts.mapInArrow(shingle_set_fn(d.minhash.n_grams, d.minhash.shingles), "node string, sh array<bigint>")
    with run.sw("verify_sets"):
        sets = materialize(sets, run.reliable)                      # read by both joins
        run.counts["candidate_docs"] = sets.count()
    joined = (pairs.join(sets.select(F.col("node").alias("src"), F.col("sh").alias("sh_a")), "src")
              .join(sets.select(F.col("node").alias("dst"), F.col("sh").alias("sh_b")), "dst")
              .select("src", "dst", "sh_a", "sh_b"))
    near = joined.mapInArrow(verify_fn(threshold), "src string, dst string, jaccard double")
    with run.sw("verify"):
        near = materialize(near, run.reliable)
        run.counts["verified_pairs"] = near.count()
    t, c = run.sw.timings_s, run.counts
    log.info("dedup: %d candidate pairs of %d documents, %d with exact Jaccard >= %.2f "
             "(candidates %.1fs, shingle sets %.1fs, verification %.1fs)", c["candidate_pairs"], c["candidate_docs"],
             c["verified_pairs"], threshold, t["candidates"], t["verify_sets"], t["verify"])
    return near


# ---- 5. clusters ---------------------------------------------------------------------------------

def clusters(keyed, near, run: DedupPass):
    """Step 5: each node's cluster root (node, root), over the exact edges (a copy to its exact root)
    and the near edges; the rounds it took go to `run.rounds`."""
    from pyspark.sql import functions as F

    edges = keyed.where(F.col("node") != F.col("_exact_root")).select(F.col("node").alias("src"),
                                                                      F.col("_exact_root").alias("dst"))
    if near is not None:
        edges = edges.unionByName(near.select("src", "dst"))
    with run.sw("clusters"):
        labels, run.rounds = star_components(edges, run.cfg.dedup.max_cc_rounds, reliable_checkpoint=run.reliable)
    log.info("dedup: connected components in %d rounds, %.1fs", run.rounds, run.sw.timings_s["clusters"])
    return labels


# ---- 6. representatives --------------------------------------------------------------------------

def _best_partners(near):
    """Each node's verified neighbour of highest Jaccard (ties: the smaller node): node, _partner, jaccard."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    both = near.select(F.col("src").alias("node"), F.col("dst").alias("_partner"), "jaccard").unionByName(
        near.select(F.col("dst").alias("node"), F.col("src").alias("_partner"), "jaccard"))
    order = Window.partitionBy("node").orderBy(F.col("jaccard").desc_nulls_last(), F.col("_partner").asc())
    return both.withColumn("_r", F.row_number().over(order)).where(F.col("_r") == 1).drop("_r")


def representatives(keyed, labels, near, run: DedupPass):
    """Step 6: (assigned, stats): every document with `keep`, and for the removed ones `kind`, `partner`
    and `jaccard`; `dup_cluster` and `dup_count` of its cluster (checkpointed); and per source counts."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with run.sw("representatives"):
        wc = Window.partitionBy("root")
        assigned = (keyed.select("source", "id", "node", "exact_key", "_exact_root", "_score", "_weight")
                    .join(labels, "node", "left")
                    .withColumn("root", F.coalesce("root", "node")))
        if near is not None:
            assigned = assigned.join(_best_partners(near), "node", "left")
        else:
            assigned = assigned.withColumn("_partner", F.lit(None).cast("string")).withColumn("jaccard", F.lit(None).cast("double"))
        keep = F.col("_rank") == 1
        same_text_as_rep = F.col("exact_key") == F.col("_rep_key")
        copy = F.col("node") != F.col("_exact_root")
        assigned = (assigned
                    .withColumn("_rank", F.row_number().over(wc.orderBy(*_representative_order(run.cfg))))
                    .withColumn("keep", keep)
                    .withColumn("dup_count", F.sum("_weight").over(wc))
                    .withColumn("_size", F.count("*").over(wc))
                    .withColumn("_rep_key", F.max(F.when(keep, F.col("exact_key"))).over(wc))
                    .withColumn("_rep_node", F.max(F.when(keep, F.col("node"))).over(wc))
                    .withColumn("kind", F.when(F.col("keep"), F.lit(None))
                                .when(same_text_as_rep | copy, F.lit("exact")).otherwise(F.lit("near")))
                    .withColumn("partner", F.regexp_replace(
                        F.when(F.col("keep"), F.lit(None)).when(same_text_as_rep, F.col("_rep_node"))
                        .when(copy, F.col("_exact_root")).otherwise(F.col("_partner")), NODE_SEP, "/"))
                    .withColumn("jaccard", F.when(F.col("keep"), F.lit(None))
                                .when(F.col("kind") == "exact", F.lit(1.0)).otherwise(F.col("jaccard")))
                    .withColumn("dup_cluster", F.regexp_replace("root", NODE_SEP, "/"))
                    .select("source", "id", "keep", "kind", "partner", "jaccard", "dup_cluster", "dup_count", "_size"))
        assigned = materialize(assigned, run.reliable)         # the writes' plans read it, not its lineage
        stats = {r["source"]: r.asDict() for r in assigned.groupBy("source").agg(
            F.count("*").alias("docs_in"),
            F.sum(F.col("keep").cast("long")).alias("docs_out"),
            F.sum((F.col("kind") == "exact").cast("long")).alias("removed_exact"),
            F.sum((F.col("kind") == "near").cast("long")).alias("removed_near"),
            F.sum((F.col("keep") & (F.col("_size") > 1)).cast("long")).alias("clusters"),
            F.max("_size").alias("largest_cluster"),
        ).collect()}
    return assigned, stats


# ---- 7. write --------------------------------------------------------------------------------------

def write_components(spark, job: ComponentJob, components: dict[str, Component], assigned, stats: dict[str, dict],
                     config: dict[str, Any], run: DedupPass) -> dict[str, ComponentManifest]:
    """Step 7: per source, the survivors (with `dup_cluster`, `dup_count`) as its component, and the
    removed documents with the edge that removed them in `_removed/`."""
    from pyspark.sql import functions as F

    d, names = run.cfg.dedup, sorted(components)
    out: dict[str, ComponentManifest] = {}
    progress = Reporter(len(names), unit="component", mode="line")
    for i, n in enumerate(names, 1):
        c = components[n]
        tmp = job.attempt(n)
        s = stats.get(n, {})
        with run.sw(f"write.{n}"):
            docs_n = cio.read_component(spark, c)
            kept_cols = [spark_col(x) for x in docs_n.columns if x not in ("dup_cluster", "dup_count")]
            mine = assigned.where(F.col("source") == n)
            survivors = (docs_n.select(*kept_cols)
                         .join(mine.where("keep").select("id", "dup_cluster", "dup_count"), "id", "inner")
                         .select(*kept_cols, "dup_cluster", "dup_count"))
            n_bytes = sum(f.n_bytes for f in c.manifest.files)
            n_files = cio.n_files_for(n_bytes, d.target_file_mb)
            cio.write_sorted_parquet(survivors, tmp, n_files,
                                     row_group_rows=cio.row_group_rows_for(n_bytes * 3, c.manifest.n_docs))
            outputs = []
            if s.get("docs_in", 0) - s.get("docs_out", 0) > 0:
                removed = mine.where(~F.col("keep")).select("id", "dup_cluster", "kind", "partner", "jaccard")
                cio.write_sorted_parquet(removed, tmp / "_removed", max(1, n_files // 8))
                outputs.append("_removed")
        counts = {k: int(s.get(k) or 0) for k in ("docs_in", "docs_out", "removed_exact", "removed_near", "clusters",
                                                  "largest_cluster")}
        counts["cc_rounds"] = run.rounds
        counts.update(run.counts)
        inputs = [cio.component_fingerprint(components[x]) for x in (names if d.scope == "global" else [n])]
        out[n] = job.commit(tmp, n, config=config, inputs=inputs, origin=c, counts=counts,
                            timings_s=run.sw.timings_s, outputs=outputs, expect_docs=counts["docs_out"],
                            n_tokens=None, tokenizer=None)
        progress.update(i, f"deduplicated {n}: {counts['docs_in']:,} -> {counts['docs_out']:,} documents "
                           f"({counts['removed_exact']:,} exact, {counts['removed_near']:,} near duplicates; "
                           f"{counts['clusters']:,} clusters, largest {counts['largest_cluster']:,})")
    return out
