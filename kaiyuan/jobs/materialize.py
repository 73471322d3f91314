"""Materialize a mixture spec at scale: component pools that do not fit one machine become the same
shard sets `python -m mixtures materialize` writes, byte for byte.

    spark-submit kaiyuan/jobs/materialize.py --spec mixture.yaml --out shards/ [--sets p2-curriculum,...]
    python -m kaiyuan materialize --spec mixture.yaml --out shards/          (a local session)

All decisions are `mixtures` functions (seeded keys, preference keys, retention, budgets and
repetition rounds, rank, bucket, uniform slots, transition positions, shard parts, the shard
writer and the manifest); this file only moves data:

- tokenization runs on executors (the tokenizer travels as a payload, no shared files needed)
  into a token spill of (component, id, n_tokens, tokens) in the work directory;
- every order-dependent number (within-component token prefix, budget order, stream position,
  offset inside a shard file) is an exact prefix sum from a range-partitioned sort: each
  partition's per-group totals are aggregated (a few numbers per partition), turned into offsets
  by `mixtures.curriculum.partition_offsets`, and added to the partition's local prefix sums.
  No document row is ever collected on the driver;
- shard files are written by tasks (one file per (segment, part), hash-partitioned, sorted
  inside the partition) with `mixtures.materialize.write_shard_file` into the set's temporary
  directory, which must be on a filesystem the driver and executors share (local disk in local
  mode, NFS/Lustre on a cluster); the driver assembles the manifest from the per-file results.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import defaultdict
from itertools import groupby
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # spark-submit runs this file directly: find the package
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    try:
        import kaiyuan  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(_here.parents[1]))

import numpy as np

from common import atomic
from common.hashing import sha256_file
from common.log import get_logger
from common.manifest import MANIFEST_NAME, find_complete, fingerprints
from mixtures import curriculum as cm
from mixtures.materialize import (assemble_manifest, component_uses_from, set_config, set_names, write_run_record,
                                  write_shard_file)
from mixtures.plan import eval_components, holdout_key_ids
from mixtures.shards import ShardFile, ShardManifest, composition_from_sums, token_dtype
from mixtures.spec import MixtureSpec, MixtureSpecError, check_components, load_spec
from mixtures.tokenizers import Tokenizer, load_tokenizer

log = get_logger("kaiyuan.materialize")


# ---- the one distributed mechanism: exact prefix sums ---------------------------------------------

def _freeze(df):
    """Pin partitions and their order (a re-run of a range partitioning could sample other bounds)."""
    sc = df.sparkSession.sparkContext
    return df.checkpoint(eager=True) if sc.getCheckpointDir() else df.localCheckpoint(eager=True)


def with_prefix(df, order_cols: list[str], *, group_col: str | None = None, value_col: str = "n",
                out_col: str = "prefix", n_partitions: int | None = None):
    """Add `out_col`: the exclusive prefix sum of `value_col` within `group_col`, in `order_cols` order.

    Range-partitioned sort, per-partition group totals (aggregated: partitions x groups numbers),
    offsets from `mixtures.curriculum.partition_offsets`, local prefix sums plus offsets.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StructField

    spark = df.sparkSession
    keys = ([group_col] if group_col else []) + order_cols
    n = n_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    s = _freeze(df.repartitionByRange(n, *keys).sortWithinPartitions(*keys).withColumn("_pid", F.spark_partition_id()))
    g = [group_col] if group_col else []
    rows = s.groupBy("_pid", *g).agg(F.sum(value_col).alias("_t")).collect()
    groups = sorted({r[group_col] if group_col else 0 for r in rows})
    gi = {k: j for j, k in enumerate(groups)}
    totals = np.zeros((n, max(len(groups), 1)), dtype=np.int64)
    for r in rows:
        totals[r["_pid"], gi[r[group_col] if group_col else 0]] = int(r["_t"] or 0)
    offsets = cm.partition_offsets(totals)
    bc = spark.sparkContext.broadcast((offsets, gi))
    schema = _nullable(s.schema, [StructField(out_col, LongType(), True)])

    def fn(batches):
        offs, index = bc.value
        carry: dict[Any, int] = {}
        for pdf in batches:
            if pdf.empty:
                continue
            pid = int(pdf["_pid"].iloc[0])
            v = pdf[value_col].to_numpy(dtype=np.int64)
            keys_ = pdf[group_col].to_numpy() if group_col else np.zeros(len(pdf), dtype=np.int64)
            out = np.empty(len(pdf), dtype=np.int64)
            for k in dict.fromkeys(keys_.tolist()):
                m = keys_ == k
                base = carry[k] if k in carry else int(offs[pid, index[k]])
                out[m] = cm.exclusive_cumsum(v[m]) + base
                carry[k] = base + int(v[m].sum())
            yield pdf.assign(**{out_col: out})

    return s.mapInPandas(fn, schema).drop("_pid")


def _nullable(schema, extra):
    """Pandas UDF output schema: every field nullable (pandas turns NaN into Arrow nulls)."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True) for f in list(schema.fields) + list(extra)])


def _signed(keys: np.ndarray) -> np.ndarray:
    return cm.signed_order_key(keys)


def _map_columns(df, new_fields: list[tuple[str, Any]], fn: Callable):
    """mapInPandas that adds columns computed by fn(pdf) -> dict of arrays."""
    from pyspark.sql.types import StructField

    schema = _nullable(df.schema, [StructField(n, t, True) for n, t in new_fields])

    def run(batches):
        for pdf in batches:
            if len(pdf):
                yield pdf.assign(**fn(pdf))

    return df.mapInPandas(run, schema)


def _per_component(pdf, spec: MixtureSpec, fn: Callable, dtype) -> np.ndarray:
    """Apply fn(component spec, rows mask) batch-wise per component; fn returns the rows' values."""
    out = np.zeros(len(pdf), dtype=dtype)
    comp = pdf["comp"].to_numpy()
    for ci in np.unique(comp):
        m = comp == ci
        out[m] = fn(spec.components[int(ci)], m)
    return out


# ---- tokenization on executors ------------------------------------------------------------------

def _tokenize(spark, spec: MixtureSpec, opened, tokenizer: Tokenizer, spill: Path):
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, DoubleType, IntegerType, LongType, StringType, StructField, StructType

    marker = spill.parent / "tokens.json"
    want = {"tokenizer": tokenizer.identity.digest,
            "components": {c.name: [sha256_file(opened[c.name].directory / MANIFEST_NAME), c.score_field]
                           for c in spec.components}}
    if marker.is_file() and json.loads(marker.read_text()) == want and (spill / "_SUCCESS").is_file():
        log.info("token spill complete from an earlier run, reused")
        return spark.read.parquet(str(spill))
    schema = StructType([StructField("comp", IntegerType(), False), StructField("id", StringType(), False),
                         StructField("uid", StringType(), False), StructField("n", LongType(), False),
                         StructField("score", DoubleType(), True), StructField("dup", LongType(), True),
                         StructField("tokens", BinaryType(), True), StructField("reason", StringType(), True)])
    arrow_schema = pa.schema([("comp", pa.int32()), ("id", pa.string()), ("uid", pa.string()), ("n", pa.int64()),
                              ("score", pa.float64()), ("dup", pa.int64()), ("tokens", pa.binary()),
                              ("reason", pa.string())])
    payload = spark.sparkContext.broadcast(tokenizer.payload())
    dtype = token_dtype(tokenizer.vocab_size)
    frames = []
    for ci, c in enumerate(spec.components):
        comp = opened[c.name]
        has_dup = "dup_count" in comp.manifest.columns
        from common.document import spark_col
        from pyspark.sql import functions as F
        # dotted score names ("quality.edu") are renamed: Arrow UDFs resolve columns by plain name
        sel = [F.col("id"), F.col("text")] + ([F.col(spark_col(c.score_field)).alias("score_in")] if c.score_field else [])
        if has_dup:
            sel.append(F.col("dup_count"))
        df = spark.read.parquet(*[str(p) for p in comp.paths]).select(*sel)

        def fn(batches, ci=ci, name=c.name, score=c.score_field, has_dup=has_dup):
            tok = Tokenizer.from_payload(payload.value)
            for b in batches:
                ids = b.column("id").to_pylist()
                texts = b.column("text").to_pylist()
                reason = [None if (t is not None and t != "") else ("null_text" if t is None else "empty_text")
                          for t in texts]
                keep = [j for j, r in enumerate(reason) if r is None]
                n = np.zeros(len(ids), dtype=np.int64)
                chunks = [b""] * len(ids)
                if keep:
                    flat, lengths = tok.encode_flat([texts[j] for j in keep])
                    data = flat.astype(dtype).tobytes()
                    ends = np.cumsum(lengths) * dtype.itemsize
                    starts = ends - lengths * dtype.itemsize
                    for j, a, z, ln in zip(keep, starts.tolist(), ends.tolist(), lengths.tolist()):
                        chunks[j] = data[a:z]
                        n[j] = ln
                yield pa.RecordBatch.from_arrays([
                    pa.array([ci] * len(ids), pa.int32()), pa.array(ids, pa.string()),
                    pa.array([f"{name}\x1f{i}" for i in ids], pa.string()), pa.array(n, pa.int64()),
                    (b.column("score_in").cast(pa.float64()) if score else pa.nulls(len(ids), pa.float64())),
                    (b.column("dup_count").cast(pa.int64()) if has_dup else pa.nulls(len(ids), pa.int64())),
                    pa.array(chunks, pa.binary()), pa.array(reason, pa.string())], schema=arrow_schema)

        frames.append(df.mapInArrow(fn, schema))
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    if spill.exists():
        shutil.rmtree(spill)
    out.write.mode("overwrite").parquet(str(spill))
    atomic.write_json(marker, want)
    return spark.read.parquet(str(spill))


# ---- the job -------------------------------------------------------------------------------------

def run(spark, spec: MixtureSpec | str, out_dir: str | Path, *, sets: list[str] | None = None,
        work_dir: str | Path | None = None, keep_work: bool = False, force: bool = False,
        progress: Callable[[str], None] | None = None) -> dict[str, ShardManifest]:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, DoubleType, LongType

    progress = progress or (lambda m: log.info(m))
    if not isinstance(spec, MixtureSpec):
        spec = load_spec(spec)
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    atomic.clean_stale_tmp(out)
    opened = check_components(spec)
    tokenizer = load_tokenizer(spec.tokenizer)
    all_sets = set_names(spec)
    if sets:
        unknown = set(sets) - {s[0] for s in all_sets}
        if unknown:
            raise MixtureSpecError("<sets>", f"unknown set(s) {sorted(unknown)}; this spec makes {[s[0] for s in all_sets]}")
    inputs = fingerprints([c.directory / MANIFEST_NAME for c in opened.values()])
    results: dict[str, ShardManifest] = {}
    todo = []
    for name, phase, order in all_sets:
        if sets and name not in sets:
            continue
        found = None if force else find_complete(out / name, ShardManifest, set_config(spec, name, phase, order), inputs)
        if found is not None and found.spec_hash == spec.spec_hash():
            results[name] = found
            progress(f"{name}: complete from an earlier run (same spec and inputs), reused")
        else:
            todo.append((name, phase, order))
    if not todo:
        return results
    work = Path(work_dir).resolve() if work_dir else out / f".work-{spec.spec_hash()[:12]}-spark"
    work.mkdir(parents=True, exist_ok=True)
    names = [c.name for c in spec.components]
    t0 = time.perf_counter()

    # 1. tokenize (executors) -------------------------------------------------------------------
    tok = _tokenize(spark, spec, opened, tokenizer, work / "tokens")
    counts = tok.groupBy("comp", "reason").count().collect()
    records: dict[str, dict[str, Any]] = {n: {"n_docs_read": 0, "quarantined": {"null_text": 0, "empty_text": 0}}
                                          for n in names}
    for r in counts:
        rec = records[names[r["comp"]]]
        rec["n_docs_read"] += r["count"]
        if r["reason"] is not None:
            rec["quarantined"][r["reason"]] = r["count"]
    for n in names:
        records[n]["component_manifest_sha256"] = sha256_file(opened[n].directory / MANIFEST_NAME)
    meta = tok.filter(F.col("reason").isNull()).drop("tokens", "reason")
    dup = meta.groupBy("comp", "id").count().filter("count > 1").limit(1).collect()
    if dup:
        from common.errors import ContractError
        raise ContractError(opened[names[dup[0]["comp"]]].directory,
                            f"document id {dup[0]['id']!r} appears twice in component '{names[dup[0]['comp']]}' "
                            "(ids must be unique for a deterministic order)", field="id")
    progress(f"tokenized {len(names)} components on executors in {time.perf_counter() - t0:.1f}s")

    # 2. held-out set and retention ---------------------------------------------------------------
    seeds = spec.seeds
    id_sets = spark.sparkContext.broadcast({c.name: c.retention.id_set() for c in spec.components
                                            if c.retention.rule == "ids"})

    sources = {c.name: opened[c.name].name for c in spec.components}

    def annotate(pdf):
        uids = pdf["uid"].to_numpy(dtype=object)
        score = pdf["score"].to_numpy(dtype=np.float64)

        def held_of(c, m):
            ids = pdf["id"].to_numpy(object)[m]
            return cm.holdout_mask(cm.doc_keys(holdout_key_ids(sources[c.name], ids), seeds.holdout, salt="holdout"),
                                   spec.holdout.fraction)

        held = (_per_component(pdf, spec, held_of, bool) if spec.holdout else np.zeros(len(pdf), dtype=bool))

        def key(c, m):
            return cm.preference_key(score[m] if c.score_field else None, c.higher_is_better, n=int(m.sum()))

        def tie0(c, m):
            return _signed(cm.doc_keys(uids[m], c.order_seed, salt="order", copies=np.zeros(int(m.sum()), np.int64)))

        def rkey(c, m):
            r = c.retention
            return _signed(cm.doc_keys(uids[m], r.seed, salt="retain")) if r.rule == "random_tokens" else 0

        def thr(c, m):
            r = c.retention
            if r.rule == "ids":
                wanted = id_sets.value[c.name]
                return np.fromiter((i in wanted for i in pdf["id"].to_numpy(object)[m]), dtype=bool, count=int(m.sum()))
            return cm.threshold_mask(score[m], r.threshold, c.higher_is_better) if r.rule == "threshold" else True

        return {"held": held, "key": _per_component(pdf, spec, key, np.float64),
                "tie0": _per_component(pdf, spec, tie0, np.int64), "rkey": _per_component(pdf, spec, rkey, np.int64),
                "thr": _per_component(pdf, spec, thr, bool)}

    meta = _freeze(_map_columns(meta, [("held", BooleanType()), ("key", DoubleType()), ("tie0", LongType()),
                                       ("rkey", LongType()), ("thr", BooleanType())], annotate))
    banded = [i for i, c in enumerate(spec.components) if c.retention.rule in ("top_fraction", "quantile_band", "random_tokens")]
    eligible = meta.filter(~F.col("held"))
    plain = eligible.filter(~F.col("comp").isin(banded)).withColumn("retained", F.col("thr"))
    if banded:
        sub = eligible.filter(F.col("comp").isin(banded))
        is_random = F.col("comp").isin([i for i in banded if spec.components[i].retention.rule == "random_tokens"])
        sub = (sub.withColumn("o1", F.when(is_random, F.lit(0.0)).otherwise(F.col("key")))
                  .withColumn("o2", F.when(is_random, F.col("rkey")).otherwise(F.col("tie0"))))
        sub = with_prefix(sub, ["o1", "o2", "uid"], group_col="comp", out_col="rprefix")
        comp_tokens = {r["comp"]: int(r["t"]) for r in sub.groupBy("comp").agg(F.sum("n").alias("t")).collect()}
        bc_tot = spark.sparkContext.broadcast(comp_tokens)

        def band(pdf):
            def f(c, m):
                r = c.retention
                prefix = pdf["rprefix"].to_numpy(np.int64)[m]
                ci = int(pdf["comp"].to_numpy()[m][0])
                if r.rule == "random_tokens":
                    return cm.take_budget(prefix, r.n_tokens)
                low, high = (1.0 - r.fraction, 1.0) if r.rule == "top_fraction" else (r.low, r.high)
                return cm.in_rank_band(prefix, bc_tot.value[ci], low, high)
            return {"retained": _per_component(pdf, spec, f, bool)}

        sub = _map_columns(sub, [("retained", BooleanType())], band).drop("o1", "o2", "rprefix")
        plain = plain.unionByName(sub)
    retained = _freeze(plain.filter(F.col("retained")).drop("retained", "thr"))
    ret_stats = {r["comp"]: (int(r["d"]), int(r["t"])) for r in
                 retained.groupBy("comp").agg(F.count("*").alias("d"), F.sum("n").alias("t")).collect()}
    ret_counts = {n: ret_stats.get(i, (0, 0)) for i, n in enumerate(names)}
    held_counts = {names[r["comp"]]: int(r["count"]) for r in meta.filter(F.col("held")).groupBy("comp").count().collect()}
    held_counts = {n: held_counts.get(n, 0) for n in names}

    # 3. phase pools ----------------------------------------------------------------------------
    pools: dict[str, Any] = {}
    pool_details: dict[str, dict[str, dict[str, Any]]] = {}
    pool_totals: dict[str, dict[int, int]] = {}
    for pi, p in enumerate(spec.phases):
        pools[p.name], pool_details[p.name], pool_totals[p.name] = _phase_pool(
            spark, spec, pi, retained, {n: ret_counts[n][1] for n in names})
        progress(f"planned phase {p.name}: {sum(pool_totals[p.name].values()):,} tokens")

    # 4. streams and 5. writing -------------------------------------------------------------------
    for set_name, phase, order in todo:
        ts = time.perf_counter()
        if phase is None:
            firsts = [names.index(n) for n in eval_components(spec, sources)]
            plan, extra = _eval_plan(spark, spec, meta.filter(F.col("comp").isin(firsts))), {}
            pool_k, buckets = None, None
        else:
            idx = [p.name for p in spec.phases].index(phase)
            p = spec.phases[idx]
            prev = spec.phases[idx - 1] if idx > 0 and p.transition_tokens else None
            plan, extra = _stream_plan(spark, spec, p, pools[phase], order,
                                       pools[prev.name] if prev else None, prev.name if prev else None)
            pool_k, buckets = spec.bucket_count_of(p), _bucket_stats(spec, pools[phase], pool_totals[phase],
                                                                      spec.bucket_count_of(p))
        plan = with_prefix(plan, ["ord_a", "ord_b", "ord_c", "ord_d"], group_col="seg_rank", out_col="seg_prefix")
        plan = plan.withColumn("part", F.floor(F.col("seg_prefix") / F.lit(spec.shard_tokens)).cast("long"))
        used: dict[int, tuple[int, int]] = {}
        present: set[str] = set()
        for r in plan.groupBy("comp", "label").agg(F.count("*").alias("d"), F.sum("n").alias("t")).collect():
            d0, t0_ = used.get(r["comp"], (0, 0))
            used[r["comp"]] = (d0 + int(r["d"]), t0_ + int(r["t"]))
            present.add(r["label"].removeprefix("replay:"))
        uses = component_uses_from(spec, phase, paths={n: str(opened[n].directory) for n in names}, records=records,
                                   retained=ret_counts, held_out=held_counts,
                                   used={n: used.get(i, (0, 0)) for i, n in enumerate(names)},
                                   phase_details=pool_details.get(phase) if phase else None, present=present)
        with atomic.atomic_path(out / set_name) as tmp:
            tmp.mkdir(parents=True)
            shards = _write_files(spark, plan, tok, tmp, tokenizer.vocab_size)
            pool_obj = _PoolInfo(pool_k) if pool_k else None
            manifest = assemble_manifest(spec, tokenizer, set_name, phase, order, shards, pool_obj, uses, inputs,
                                         extra, buckets=buckets)
            manifest.write(tmp)
            write_run_record(tmp, set_name, "spark", manifest, {"total": time.perf_counter() - ts})
        results[set_name] = manifest
        progress(f"wrote {set_name}: {len(shards)} shards, {manifest.n_tokens:,} tokens, {manifest.n_docs:,} docs "
                 f"in {time.perf_counter() - ts:.1f}s")
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return results


class _PoolInfo:
    """What `assemble_manifest` reads of a pool when the buckets come precomputed."""

    def __init__(self, bucket_count: int):
        self.bucket_count = bucket_count


def _phase_pool(spark, spec: MixtureSpec, pi: int, retained, retained_tokens: dict[str, int]):
    """Budgets, repetition, within-component rank and bucket (mixtures.plan.plan_phase_pool, distributed)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType

    p = spec.phases[pi]
    names = [c.name for c in spec.components]
    members = [names.index(n) for n in p.components]
    K = spec.bucket_count_of(p)
    weights = {n: s.weight for n, s in p.components.items()} if p.weighted else None
    budgets = {n: s.n_tokens for n, s in p.components.items()}
    repeatable = {n: spec.component(n).repeat != "none" for n in p.components}
    try:
        b, _total = cm.phase_budgets({n: retained_tokens[n] for n in p.components}, weights, budgets, p.n_tokens,
                                     repeatable)
    except ValueError as e:
        raise MixtureSpecError("<spec>", str(e), field=f"phases[{pi}].components") from None
    rows = retained.filter(F.col("comp").isin(members))
    salt = f"budget:{p.name}"
    extra = {names.index(n): b[n] - retained_tokens[n] for n in p.components}
    if any(e != 0 for e in extra.values()):     # the budget order matters only when something is cut or repeated
        rows = _map_columns(rows, [("bkey", LongType())], lambda pdf: {
            "bkey": _signed(cm.doc_keys(pdf["uid"].to_numpy(object), spec.seeds.budget, salt=salt))})
        rows = with_prefix(rows, ["bkey", "uid"], group_col="comp", out_col="bprefix")
    else:
        rows = rows.withColumn("bkey", F.lit(0).cast("long")).withColumn("bprefix", F.lit(0).cast("long"))
    # below the retained mass: a seeded subset; above it: dup_count rounds, then whole passes
    copies = F.when(F.lit(False), F.lit(0))
    for ci, e in extra.items():
        if e < 0:
            copies = copies.when(F.col("comp") == ci, (F.col("bprefix") < F.lit(b[names[ci]])).cast("long"))
    rows = rows.withColumn("copies", copies.otherwise(F.lit(1)).cast("long"))
    dup_comps = {ci: e for ci, e in extra.items() if e > 0 and spec.components[ci].repeat == "dup_count"}
    j = 1
    while dup_comps:
        elig = F.col("comp").isin(list(dup_comps)) & (F.greatest(F.coalesce(F.col("dup"), F.lit(1)), F.lit(1)) > j)
        rows = _freeze(rows.withColumn("m", F.when(elig, F.col("n")).otherwise(F.lit(0))))
        rows = with_prefix(rows, ["bkey", "uid"], group_col="comp", value_col="m", out_col="dprefix")
        bc = dict(dup_comps)
        take = F.lit(False)
        for ci, e in bc.items():
            take = take | ((F.col("comp") == ci) & elig & (F.col("dprefix") < F.lit(e)))
        rows = _freeze(rows.withColumn("take", take).withColumn("copies", F.col("copies") + F.col("take").cast("long")))
        stats = {r["comp"]: (int(r["t"] or 0), int(r["c"] or 0)) for r in rows.groupBy("comp").agg(
            F.sum(F.when(F.col("take"), F.col("n")).otherwise(0)).alias("t"),
            F.sum(elig.cast("long")).alias("c")).collect()}
        for ci in list(dup_comps):
            taken, n_elig = stats.get(ci, (0, 0))
            extra[ci] -= taken
            dup_comps[ci] = extra[ci]
            if extra[ci] <= 0 or not n_elig:
                del dup_comps[ci]
        rows = rows.drop("m", "dprefix", "take")
        j += 1
    passes = F.lit(0).cast("long")
    for ci, e in extra.items():
        if e > 0:
            q, rem = divmod(e, retained_tokens[names[ci]])
            passes = F.when(F.col("comp") == ci, F.lit(q) + (F.col("bprefix") < F.lit(rem)).cast("long")).otherwise(passes)
    rows = rows.withColumn("copies", F.col("copies") + passes).filter(F.col("copies") > 0)
    rows = rows.withColumn("copy", F.explode(F.sequence(F.lit(0).cast("long"), F.col("copies") - 1)))
    rows = rows.drop("copies", "bkey", "bprefix")
    rows = _map_columns(rows, [("tie", LongType())], lambda pdf: {"tie": _per_component(
        pdf, spec, lambda c, m: _signed(cm.doc_keys(pdf["uid"].to_numpy(object)[m], c.order_seed, salt="order",
                                                   copies=pdf["copy"].to_numpy(np.int64)[m])), np.int64)})
    rows = with_prefix(rows, ["key", "tie", "uid", "copy"], group_col="comp", out_col="prefix")
    agg = rows.groupBy("comp").agg(F.sum("n").alias("t"), F.count("*").alias("d"),
                                   F.sum((F.col("copy") > 0).cast("long")).alias("rep")).collect()
    totals = {r["comp"]: int(r["t"]) for r in agg}
    bc_tot = spark.sparkContext.broadcast(totals)

    def rank_bucket(pdf):
        tot = np.array([bc_tot.value[int(c)] for c in pdf["comp"].to_numpy()], dtype=np.int64)
        prefix = pdf["prefix"].to_numpy(np.int64)
        return {"rank": cm.rank_of(prefix, tot), "bucket": cm.bucket_of(prefix, tot, K)}

    pool = _freeze(_map_columns(rows, [("rank", DoubleType()), ("bucket", LongType())], rank_bucket).drop("tie"))
    details = {}
    for r in agg:
        n = names[r["comp"]]
        details[n] = {"budget_tokens": b[n], "n_tokens_retained": retained_tokens[n], "n_tokens_used": int(r["t"]),
                      "n_docs_used": int(r["d"]), "n_repeated_docs": int(r["rep"])}
    return pool, details, totals


def _bucket_stats(spec: MixtureSpec, pool, totals: dict[int, int], K: int):
    """Per-bucket composition with exact integer rank sums (mixtures.plan.bucket_stats, distributed)."""
    from pyspark.sql import functions as F

    names = [c.name for c in spec.components]
    dec = "decimal(38,0)"
    rows = pool.groupBy("bucket", "comp").agg(F.sum("n").alias("t"), F.count("*").alias("d"),
                                              F.sum(F.col("prefix").cast(dec) * F.col("n").cast(dec)).alias("s")).collect()
    by_k: dict[int, list] = defaultdict(list)
    for r in rows:
        by_k[int(r["bucket"])].append(r)
    out = []
    for k in range(K):
        tokens = {names[r["comp"]]: int(r["t"]) for r in by_k[k]}
        rank_sums = {names[r["comp"]]: (int(r["s"]) / totals[r["comp"]] if totals[r["comp"]] else 0.0) for r in by_k[k]}
        out.append(composition_from_sums(cm.segment_name("curriculum", k), sum(tokens.values()),
                                         sum(int(r["d"]) for r in by_k[k]), tokens, rank_sums))
    return out


def _label_col(spec: MixtureSpec, replay: bool):
    from pyspark.sql import functions as F

    expr = None
    for i, c in enumerate(spec.components):
        v = F.lit(("replay:" if replay else "") + c.name)
        expr = F.when(F.col("comp") == i, v) if expr is None else expr.when(F.col("comp") == i, v)
    return expr


def _stream_plan(spark, spec: MixtureSpec, p, pool, order: str, prev_pool, prev_name: str | None):
    """mixtures.plan.plan_stream, distributed: stream order columns (seg_rank, ord_a..ord_d)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType

    K = spec.bucket_count_of(p)
    seed, salt = ((spec.seeds.bucket_shuffle, f"bucket:{p.name}") if order == "curriculum"
                  else (spec.seeds.uniform, f"uniform:{p.name}"))

    def keys(pdf):
        h = cm.doc_keys(pdf["uid"].to_numpy(object), seed, salt=salt, copies=pdf["copy"].to_numpy(np.int64))
        seg = pdf["bucket"].to_numpy(np.int64) if order == "curriculum" else cm.uniform_slot(h, K)
        return {"skey": _signed(h), "seg": seg}

    s = _map_columns(pool, [("skey", LongType()), ("seg", LongType())], keys)
    s = s.withColumn("label", _label_col(spec, False))
    cols = ["comp", "id", "n", "bucket", "rank", "copy", "label", "seg_rank", "segment", "ord_a", "ord_b", "ord_c", "ord_d"]
    seg_names = F.concat(F.lit("b" if order == "curriculum" else "u"), F.lpad(F.col("seg").cast("string"), 4, "0"))
    body = (s.withColumn("seg_rank", F.col("seg")).withColumn("segment", seg_names).withColumn("ord_a", F.lit(0.0))
             .withColumn("ord_b", F.col("skey")).withColumn("ord_c", F.col("uid")).withColumn("ord_d", F.col("copy")))
    L = p.transition_tokens
    if not (L and prev_pool is not None):
        return body.select(*cols), {}
    body = with_prefix(body, ["seg_rank", "ord_b", "ord_c", "ord_d"], out_col="sprefix")
    rsalt = f"replay:{p.name}"
    rep = _map_columns(prev_pool, [("replay_key", LongType())], lambda pdf: {"replay_key": _signed(cm.doc_keys(
        pdf["uid"].to_numpy(object), spec.seeds.replay, salt=rsalt, copies=pdf["copy"].to_numpy(np.int64)))})
    rep = with_prefix(rep, ["replay_key", "uid", "copy"], out_col="sprefix")
    rep = rep.filter(F.col("sprefix") * 2 < F.lit(L))
    head = body.filter(F.col("sprefix") * 2 < F.lit(L))
    rest = body.filter(F.col("sprefix") * 2 >= F.lit(L)).select(*cols)

    def p1_pos(pdf):
        return {"ord_a": cm.transition_p1_position(pdf["sprefix"].to_numpy(np.int64), L)}

    def p2_pos(pdf):
        return {"ord_a2": cm.transition_p2_position(pdf["sprefix"].to_numpy(np.int64), L)}

    rep = (_map_columns(rep, [("ord_a", DoubleType())], p1_pos).withColumn("label", _label_col(spec, True))
           .withColumn("bucket", F.lit(-1).cast("long")).withColumn("ord_b", F.lit(0).cast("long")))
    head = (_map_columns(head, [("ord_a2", DoubleType())], p2_pos).drop("ord_a").withColumnRenamed("ord_a2", "ord_a")
            .withColumn("ord_b", F.lit(1).cast("long")))
    window = (rep.select(*[c for c in cols if c not in ("seg_rank", "segment", "ord_c", "ord_d")], "sprefix")
              .unionByName(head.select(*[c for c in cols if c not in ("seg_rank", "segment", "ord_c", "ord_d")], "sprefix")))
    window = (window.withColumn("seg_rank", F.lit(-1).cast("long")).withColumn("segment", F.lit(cm.segment_name("transition", 0)))
              .withColumn("ord_c", F.lit("")).withColumn("ord_d", F.col("sprefix")).select(*cols))
    sides = {r["ord_b"]: int(r["t"] or 0) for r in window.groupBy("ord_b").agg(F.sum("n").alias("t")).collect()}
    r_tok, h_tok = sides.get(0, 0), sides.get(1, 0)
    extra = {"transition": {"from_phase": prev_name, "transition_tokens": int(L), "replay_tokens": int(r_tok),
                            "phase_tokens": int(h_tok), "window_tokens": int(r_tok + h_tok)}}
    return window.unionByName(rest), extra


def _eval_plan(spark, spec: MixtureSpec, meta):
    """mixtures.plan.plan_eval, distributed."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    held = meta.filter(F.col("held")).withColumn("copy", F.lit(0).cast("long"))
    held = _map_columns(held, [("ekey", LongType())], lambda pdf: {"ekey": _signed(cm.doc_keys(
        pdf["uid"].to_numpy(object), spec.seeds.holdout, salt="eval", copies=pdf["copy"].to_numpy(np.int64)))})
    if spec.holdout is not None and spec.holdout.max_tokens:
        held = with_prefix(held, ["ekey", "uid"], out_col="eprefix").filter(F.col("eprefix") < F.lit(spec.holdout.max_tokens))
    return (held.withColumn("label", _label_col(spec, False)).withColumn("bucket", F.lit(-1).cast("long"))
            .withColumn("rank", F.lit(float("nan"))).withColumn("seg_rank", F.lit(0).cast("long"))
            .withColumn("segment", F.lit(cm.segment_name("eval", 0))).withColumn("ord_a", F.lit(0.0))
            .withColumn("ord_b", F.col("ekey")).withColumn("ord_c", F.col("uid")).withColumn("ord_d", F.col("copy"))
            .select("comp", "id", "n", "bucket", "rank", "copy", "label", "seg_rank", "segment",
                    "ord_a", "ord_b", "ord_c", "ord_d"))


def _write_files(spark, plan, tok, directory: Path, vocab_size: int) -> list[ShardFile]:
    """Each task writes whole shard files (one per (segment, part)) with the shared writer."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from mixtures.curriculum import shard_name

    tokens = tok.filter(F.col("reason").isNull()).select("comp", "id", "tokens")
    joined = plan.join(tokens, on=["comp", "id"], how="inner")
    keys = ["seg_rank", "part"]
    joined = (joined.repartition(2 * spark.sparkContext.defaultParallelism, *keys)
              .sortWithinPartitions(*keys, "ord_a", "ord_b", "ord_c", "ord_d"))
    dtype = token_dtype(vocab_size)
    target = str(directory)
    schema = StructType([StructField("seg_rank", LongType()), StructField("part", LongType()),
                         StructField("shard", StringType())])

    def fn(batches):
        import pandas as pd

        def rows():
            for pdf in batches:
                for r in zip(pdf["segment"], pdf["part"], pdf["tokens"], pdf["id"], pdf["label"], pdf["bucket"],
                             pdf["rank"], pdf["copy"], pdf["seg_rank"]):
                    yield r

        for (segment, part, seg_rank), grp in groupby(rows(), key=lambda r: (r[0], int(r[1]), int(r[8]))):
            docs = ((np.frombuffer(r[2], dtype=dtype), str(r[3]), str(r[4]), int(r[5]), float(r[6]), int(r[7]))
                    for r in grp)
            sf = write_shard_file(Path(target), shard_name(segment, part), segment, docs, vocab_size)
            yield pd.DataFrame({"seg_rank": [seg_rank], "part": [part], "shard": [sf.model_dump_json()]})

    got = joined.mapInPandas(fn, schema).collect()
    got.sort(key=lambda r: (r["seg_rank"], r["part"]))
    return [ShardFile.model_validate_json(r["shard"]) for r in got]


# ---- command line ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    from common.errors import ContractError
    from kaiyuan.config import SparkConfig
    from kaiyuan.spark.session import get_session

    ap = argparse.ArgumentParser(prog="kaiyuan materialize", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="the mixture spec (YAML)")
    ap.add_argument("--out", required=True, help="output directory: one shard set per phase and order, plus eval")
    ap.add_argument("--sets", default="", help="comma-separated set names (default: all)")
    ap.add_argument("--work-dir", default=None, help="token spill and checkpoints (default: <out>/.work-<hash>-spark)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--force", action="store_true", help="rewrite sets that are complete")
    ap.add_argument("--master", default=None, help="Spark master when not under spark-submit (default local[*])")
    ap.add_argument("--driver-memory", default=None)
    ap.add_argument("--shuffle-partitions", type=int, default=None)
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the spec")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.spec, args.overrides)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    spark = get_session(SparkConfig(master=args.master, driver_memory=args.driver_memory,
                                    shuffle_partitions=args.shuffle_partitions), "kaiyuan-materialize")
    try:
        results = run(spark, spec, args.out, sets=[s for s in args.sets.split(",") if s] or None,
                      work_dir=args.work_dir, keep_work=args.keep_work, force=args.force, progress=print)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    for name, m in results.items():
        print(f"{name}: {m.n_tokens:,} tokens, {m.n_docs:,} docs, {len(m.shards)} shards -> {Path(args.out) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
