"""The Spark engine of mixture materialization: component pools that do not fit one machine become
the same shard sets `python -m mixtures materialize` writes, byte for byte.

All decisions are `mixtures` functions (seeded keys, preference keys, retention, budgets and
capped repetition, rank, bucket, uniform slots, transition positions, shard parts, the shard
writer, set selection and the manifest); this module only moves data, in the local engine's steps:

1. `tokenize`        executors tokenize every component once; each task writes its documents'
                     tokens to a spill file of its own and returns metadata rows only (component,
                     id, n_tokens, score, dup_count, quarantine reason, spill file and offset)
2. `spill_records`   documents read and quarantined per component; `check_unique_ids`
3. `annotate`        held-out flag, preference key, seeded tie-break and retention keys
4. `retain`          the retention rules (rank-based ones through `with_prefix`)
5. `phase_pool`      budgets, repetition (one aggregation and one sort per phase, whatever the
                     dup_counts), the pass-major within-component order, rank and bucket
6. `stream_plan`     stream order columns (ord_a..ord_d) with the transition merged in, or
   `eval_plan`       the held-out set's order
7. `assign_parts`    each document's offset inside its segment -> its shard file
8. `write_files`     tasks write whole shard files (one per (segment, part)), reading each
                     document's tokens from the spill by position

Every order-dependent number is an exact prefix sum from a range-partitioned sort (`with_prefix`):
each partition's per-group totals are aggregated (a few numbers per partition), turned into
offsets by `mixtures.curriculum.partition_offsets` and added to the partition's local sums. No
document row reaches the driver, and token data moves once after tokenization (spill -> shard
file): every shuffle of the plan carries per-document metadata (~175 bytes), never tokens. The
plan's per-batch functions read Arrow batches as numpy columns (`ArrowColumns`, `mapInArrow`: no
pandas round trip). The spill and the sets' attempts are on a filesystem the driver and
executors share (local disk in local mode, NFS/Lustre on a cluster) or on an object store: tasks
then write the spill as one object each and upload each shard file once written, the driver
commits each set (commit record last), and a write task fetches a spill file whole into its
executor's scratch directory the first time it needs it (`local_spill`; docs/scaling.md says
when that stops scaling).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from purokit import atomic, storage
from purokit.component import Component
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.log import get_logger
from purokit.manifest import MANIFEST_NAME, fingerprints
from kaiyuan.spark.components_io import read_parquet, write_sorted_parquet
from mixtures import curriculum as cm
from mixtures.materialize import (BATCH_DOCS, assemble_manifest, component_uses_from, select_sets, set_progress,
                                  write_run_record, write_shard_file)
from mixtures.plan import eval_components, holdout_key_ids
from mixtures.shards import CompositionStats, ShardFile, ShardManifest, composition_from_sums, token_dtype
from mixtures.spec import MixtureSpec, MixtureSpecError, check_components, load_spec
from mixtures.tokenizers import Tokenizer, load_tokenizer

log = get_logger("kaiyuan.materialize")

PLAN_COLUMNS = ["comp", "id", "n", "bucket", "rank", "copy", "label", "tfile", "toff",
                "seg_rank", "segment", "ord_a", "ord_b", "ord_c", "ord_d"]
ORDER = ["ord_a", "ord_b", "ord_c", "ord_d"]
MAX_OPEN_SPILL_FILES = 256


# ---- the one distributed mechanism: exact prefix sums ---------------------------------------------

def profiled(fn: Callable) -> Callable:
    """fn itself, or (when the driver's environment names PUROKIT_UDF_PROFILE_DIR) fn under
    cProfile (CPU time) in the executors' Python workers, one stats file per task
    (benchmarks/profile_materialize_spark.py reads them)."""
    directory = os.environ.get("PUROKIT_UDF_PROFILE_DIR")
    if not directory:
        return fn

    def run(batches):
        import cProfile

        prof, it = cProfile.Profile(time.process_time), fn(batches)
        while True:
            prof.enable()
            try:
                out = next(it)
            except StopIteration:
                break
            finally:
                prof.disable()
            yield out
        prof.dump_stats(os.path.join(directory, f"{fn.__qualname__}-{uuid.uuid4().hex[:12]}.prof"))

    return run


def freeze(df):
    """Pin partitions and their order (a re-run of a range partitioning could sample other
    bounds): a reliable checkpoint when the context has a checkpoint directory (`--checkpoint-dir`;
    survives a lost executor), else a local one."""
    sc = df.sparkSession.sparkContext
    return df.checkpoint(eager=True) if sc.getCheckpointDir() else df.localCheckpoint(eager=True)


def with_prefix(df, order_cols: list[str], *, group_col: str | None = None, sums: dict[str, str] | None = None,
                n_partitions: int | None = None):
    """Add, for each `out: value` of `sums` (default {"prefix": "n"}), the exclusive prefix sum of
    `value` within `group_col` in `order_cols` order.

    One range-partitioned sort, one aggregation of per-partition group totals (partitions x groups
    x len(sums) numbers), offsets from `mixtures.curriculum.partition_offsets`, local prefix sums
    plus offsets.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    sums = sums or {"prefix": "n"}
    spark = df.sparkSession
    keys = ([group_col] if group_col else []) + order_cols
    n = n_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    s = freeze(df.repartitionByRange(n, *keys).sortWithinPartitions(*keys).withColumn("_pid", F.spark_partition_id()))
    g = [group_col] if group_col else []
    values = list(sums.values())
    rows = s.groupBy("_pid", *g).agg(*[F.sum(v).alias(f"_t{i}") for i, v in enumerate(values)]).collect()
    groups = sorted({r[group_col] if group_col else 0 for r in rows})
    gi = {k: j for j, k in enumerate(groups)}
    totals = np.zeros((n, max(len(groups), 1), len(values)), dtype=np.int64)
    for r in rows:
        for i in range(len(values)):
            totals[r["_pid"], gi[r[group_col] if group_col else 0], i] = int(r[f"_t{i}"] or 0)
    offsets = cm.partition_offsets(totals.reshape(n, -1)).reshape(totals.shape)
    bc = spark.sparkContext.broadcast((offsets, gi))
    carry: dict[Any, np.ndarray] = {}            # running sums of this task's partition, per group

    def prefix(cols: "ArrowColumns") -> dict[str, np.ndarray]:
        from pyspark import TaskContext

        offs, index = bc.value
        pid = int(cols["_pid"].to_numpy()[0])
        task = TaskContext.get().taskAttemptId()
        v = np.stack([cols[c].to_numpy(np.int64) for c in values], axis=1)
        group = cols[group_col].to_numpy() if group_col else np.zeros(len(cols), dtype=np.int64)
        out = np.empty_like(v)
        for k in dict.fromkeys(group.tolist()):
            m = group == k
            base = carry[task, k] if (task, k) in carry else offs[pid, index[k]]
            out[m] = cm.exclusive_cumsum(v[m]) + base
            carry[task, k] = base + v[m].sum(axis=0)
        return {o: out[:, i] for i, o in enumerate(sums)}

    return _map_columns(s, [(o, LongType()) for o in sums], prefix).drop("_pid")


class ArrowColumns:
    """One Arrow batch seen column by column as numpy arrays (`cols["n"].to_numpy(np.int64)`,
    `cols["dup"].fillna(1)`, `cols[mask]`): what the plan's per-batch functions read, without a
    pandas round trip."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch

    def __len__(self) -> int:
        return self.batch.num_rows

    def __getitem__(self, key):
        if isinstance(key, str):
            return ArrowColumn(self.batch.column(key))
        return ArrowColumns(self.batch.filter(pa.array(np.asarray(key, dtype=bool))))


class ArrowColumn:
    def __init__(self, array: pa.Array):
        self.array = array

    def fillna(self, value) -> "ArrowColumn":
        return ArrowColumn(self.array.fill_null(value))

    def to_numpy(self, dtype=None) -> np.ndarray:
        a = self.array
        if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
            return np.array(a.to_pylist(), dtype=object)
        if a.null_count and pa.types.is_integer(a.type):
            a = a.cast(pa.float64())                 # nulls become NaN, as pandas has them
        out = a.to_numpy(zero_copy_only=False)
        return out if dtype is None else out.astype(dtype, copy=False)


def _map_columns(df, new_fields: list[tuple[str, Any]], fn: Callable):
    """mapInArrow that appends the columns computed by fn(ArrowColumns) -> {name: array}."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StructField

    schema = _nullable(df.schema, [StructField(n, t, True) for n, t in new_fields])
    types = [(n, to_arrow_type(t)) for n, t in new_fields]

    def run(batches):
        for b in batches:
            if b.num_rows:
                got = fn(ArrowColumns(b))
                yield pa.RecordBatch.from_arrays(
                    b.columns + [pa.array(np.ascontiguousarray(np.broadcast_to(got[n], b.num_rows)), t) for n, t in types],
                    names=b.schema.names + [n for n, _ in types])

    return df.mapInArrow(profiled(run), schema)


def _nullable(schema, extra):
    """UDF output schema: every field nullable."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(f.name, f.dataType, True) for f in list(schema.fields) + list(extra)])


def _per_component(cols, spec: MixtureSpec, fn: Callable, dtype) -> np.ndarray:
    """Apply fn(component spec, rows mask) batch-wise per component; fn returns the rows' values."""
    out = np.zeros(len(cols), dtype=dtype)
    comp = cols["comp"].to_numpy()
    for ci in np.unique(comp):
        m = comp == ci
        out[m] = fn(spec.components[int(ci)], m)
    return out


def _keys(cols, seed: int, salt: str, copies: bool = True) -> np.ndarray:
    """Signed seeded keys of a batch's documents (Spark has no unsigned longs)."""
    copy = cols["copy"].to_numpy(np.int64) if copies else None
    return cm.signed_order_key(cm.doc_keys(cols["uid"].to_numpy(object), seed, salt=salt, copies=copy))


def _by_comp(rows, key: str, names: list[str], default=0) -> dict[str, Any]:
    got = {names[r["comp"]]: r[key] for r in rows}
    return {n: got.get(n, default) for n in names}


# ---- 1. tokenize -------------------------------------------------------------------------------

def tokenize(spark, spec: MixtureSpec, opened: dict[str, Component], tokenizer: Tokenizer, spill: Path):
    """Metadata of every document (tokens stay in `spill/tokens/*.bin`, one file per task);
    reuses a complete spill of the same components and tokenizer."""
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

    marker, meta_dir, token_dir = spill / "tokens.json", spill / "meta", spill / "tokens"
    want = {"tokenizer": tokenizer.identity.digest,
            "components": {c.name: [sha256_file(opened[c.name].directory / MANIFEST_NAME), c.score_field]
                           for c in spec.components}}
    if marker.is_file() and json.loads(marker.read_text()) == want:     # the marker is written last
        log.info("token spill complete from an earlier run, reused")
        return _read_meta(spark, meta_dir)
    if spill.exists():
        storage.remove_tree(spill)
    storage.makedirs(token_dir)
    fields = [("comp", IntegerType(), pa.int32()), ("id", StringType(), pa.string()), ("uid", StringType(), pa.string()),
              ("n", LongType(), pa.int64()), ("score", DoubleType(), pa.float64()), ("dup", LongType(), pa.int64()),
              ("reason", StringType(), pa.string()), ("tfile", StringType(), pa.string()), ("toff", LongType(), pa.int64())]
    schema = StructType([StructField(n, t, True) for n, t, _ in fields])
    arrow_schema = pa.schema([(n, a) for n, _, a in fields])
    payload = spark.sparkContext.broadcast(tokenizer.payload())
    dtype = token_dtype(tokenizer.vocab_size)
    tokens_url, digest = str(token_dir), tokenizer.identity.digest
    # runs of whole parquet files per task, read by pyarrow in the Python worker (as the local
    # path reads them): the text goes from the file to the tokenizer without passing through the JVM
    files = [(ci, str(p)) for ci, c in enumerate(spec.components) for p in opened[c.name].paths]
    kinds = [(c.name, c.score_field, "dup_count" in opened[c.name].manifest.columns) for c in spec.components]

    def fn(batches):
        from pyspark import TaskContext

        tok = worker_tokenizer(payload, digest)
        ctx = TaskContext.get()
        tfile = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}.bin"
        offset = 0
        # one object per task on a store (streamed up in parts); a local file otherwise
        with storage.open(storage.join(tokens_url, tfile), "wb") as fh:
            for b in batches:
                for idx in b.column("id").to_pylist():
                    ci, path = files[idx]
                    for doc in _component_batches(path, *kinds[ci][1:]):
                        meta = _tokenize_batch(doc, tok, dtype, fh, tfile, offset, ci, kinds[ci][0],
                                               kinds[ci][1] is not None, kinds[ci][2], arrow_schema)
                        offset += int(pc.sum(meta.column("n")).as_py() or 0)
                        yield meta

    tasks = tokenize_tasks(spark, spec, opened)
    out = spark.range(0, len(files), 1, numPartitions=tasks).mapInArrow(profiled(fn), schema)
    write_sorted_parquet(out, meta_dir, 0, sort_cols=("comp", "id"), already_partitioned=True)
    atomic.write_json(marker, want)
    return _read_meta(spark, meta_dir)


def tokenize_tasks(spark, spec: MixtureSpec, opened: dict[str, Component], task_bytes: int = 128 << 20) -> int:
    """How many tokenize tasks: about `task_bytes` of parquet each (Spark's own split size), at
    least two per executor core, at most one per file; each task reads a run of whole files."""
    sizes = [f.n_bytes for c in spec.components for f in opened[c.name].manifest.files]
    want = max(2 * spark.sparkContext.defaultParallelism, -(-sum(sizes) // task_bytes))
    return max(1, min(len(sizes), want))


def _component_batches(path: str, score_field: str | None, has_dup: bool):
    """A component file's documents in batches of the local path's size, with the columns
    tokenization needs (the score renamed `score_in`)."""
    cols = ["id", "text"] + ([score_field] if score_field else []) + (["dup_count"] if has_dup else [])
    names = ["id", "text"] + (["score_in"] if score_field else []) + (["dup_count"] if has_dup else [])
    for b in storage.parquet_file(path).iter_batches(batch_size=BATCH_DOCS, columns=cols):
        yield pa.RecordBatch.from_arrays(b.columns, names=names)


_TOKENIZERS: dict[str, Tokenizer] = {}


def worker_tokenizer(payload, digest: str) -> Tokenizer:
    """The broadcast tokenizer of identity `digest`, built once per Python worker process
    (workers are reused across tasks) rather than once per task."""
    if digest not in _TOKENIZERS:
        _TOKENIZERS[digest] = Tokenizer.from_payload(payload.value)
    return _TOKENIZERS[digest]


def _read_meta(spark, meta_dir):
    """The metadata rows `tokenize` wrote (pyarrow parts, on any filesystem)."""
    return read_parquet(spark, sorted(storage.glob(storage.join(meta_dir, "part-*.parquet"))))


def _tokenize_batch(b, tok: Tokenizer, dtype, fh, tfile: str, offset: int, ci: int, name: str, scored: bool,
                    has_dup: bool, arrow_schema) -> pa.RecordBatch:
    """One Arrow batch: tokens appended to the task's spill file, metadata rows returned."""
    ids = b.column("id").to_pylist()
    texts = b.column("text").to_pylist()
    reason = [None if (t is not None and t != "") else ("null_text" if t is None else "empty_text") for t in texts]
    keep = [j for j, r in enumerate(reason) if r is None]
    n = np.zeros(len(ids), dtype=np.int64)
    toff = np.zeros(len(ids), dtype=np.int64)
    if keep:
        flat, lengths = tok.encode_flat([texts[j] for j in keep])
        fh.write(flat.astype(dtype).tobytes())
        n[keep] = lengths
        toff[keep] = offset + cm.exclusive_cumsum(lengths)
    return pa.RecordBatch.from_arrays([
        pa.array([ci] * len(ids), pa.int32()), b.column("id").cast(pa.string()),
        pc.binary_join_element_wise(pa.scalar(name), b.column("id").cast(pa.string()), "\x1f"), pa.array(n, pa.int64()),
        (b.column("score_in").cast(pa.float64()) if scored else pa.nulls(len(ids), pa.float64())),
        (b.column("dup_count").cast(pa.int64()) if has_dup else pa.nulls(len(ids), pa.int64())),
        pa.array(reason, pa.string()), pa.array([tfile] * len(ids), pa.string()), pa.array(toff, pa.int64())],
        schema=arrow_schema)


# ---- 2. what tokenization counted ---------------------------------------------------------------

def spill_records(meta, spec: MixtureSpec, opened: dict[str, Component]) -> dict[str, dict[str, Any]]:
    """Per component: documents read, quarantined by reason, the component manifest's sha256."""
    names = [c.name for c in spec.components]
    records = {n: {"n_docs_read": 0, "quarantined": {"null_text": 0, "empty_text": 0},
                   "component_manifest_sha256": sha256_file(opened[n].directory / MANIFEST_NAME)} for n in names}
    for r in meta.groupBy("comp", "reason").count().collect():
        rec = records[names[r["comp"]]]
        rec["n_docs_read"] += r["count"]
        if r["reason"] is not None:
            rec["quarantined"][r["reason"]] = r["count"]
    return records


def check_unique_ids(meta, spec: MixtureSpec, opened: dict[str, Component]) -> None:
    dup = meta.groupBy("comp", "id").count().filter("count > 1").limit(1).collect()
    if dup:
        name = spec.components[dup[0]["comp"]].name
        raise ContractError(opened[name].directory, f"document id {dup[0]['id']!r} appears twice in component "
                            f"'{name}' (ids must be unique for a deterministic order)", field="id")


# ---- 3. annotate and 4. retain -------------------------------------------------------------------

def annotate(spark, spec: MixtureSpec, docs, sources: dict[str, str]):
    """Per document: `held` (held out), `key` (preference, ascending = less preferred), `order_tie`
    (the seeded tie-break of copy 0), `retain_key` (random_tokens order), `rule_keep` (the
    threshold / ids rules)."""
    from pyspark.sql.types import BooleanType, DoubleType, LongType

    id_sets = spark.sparkContext.broadcast({c.name: c.retention.id_set() for c in spec.components
                                            if c.retention.rule == "ids"})

    def columns(cols):
        uids = cols["uid"].to_numpy(dtype=object)
        ids = cols["id"].to_numpy(dtype=object)
        score = cols["score"].to_numpy(dtype=np.float64)

        def held(c, m):
            keys = cm.doc_keys(holdout_key_ids(sources[c.name], ids[m]), spec.seeds.holdout, salt="holdout")
            return cm.holdout_mask(keys, spec.holdout.fraction)

        def key(c, m):
            return cm.preference_key(score[m] if c.score_field else None, c.higher_is_better, n=int(m.sum()))

        def order_tie(c, m):
            return cm.signed_order_key(cm.doc_keys(uids[m], c.order_seed, salt="order",
                                                   copies=np.zeros(int(m.sum()), np.int64)))

        def retain_key(c, m):
            r = c.retention
            return cm.signed_order_key(cm.doc_keys(uids[m], r.seed, salt="retain")) if r.rule == "random_tokens" else 0

        def rule_keep(c, m):
            r = c.retention
            if r.rule == "ids":
                wanted = id_sets.value[c.name]
                return np.fromiter((i in wanted for i in ids[m]), dtype=bool, count=int(m.sum()))
            return cm.threshold_mask(score[m], r.threshold, c.higher_is_better) if r.rule == "threshold" else True

        return {"held": (_per_component(cols, spec, held, bool) if spec.holdout else np.zeros(len(cols), dtype=bool)),
                "key": _per_component(cols, spec, key, np.float64),
                "order_tie": _per_component(cols, spec, order_tie, np.int64),
                "retain_key": _per_component(cols, spec, retain_key, np.int64),
                "rule_keep": _per_component(cols, spec, rule_keep, bool)}

    return freeze(_map_columns(docs, [("held", BooleanType()), ("key", DoubleType()), ("order_tie", LongType()),
                                      ("retain_key", LongType()), ("rule_keep", BooleanType())], columns))


def retain(spark, spec: MixtureSpec, annotated):
    """The retained documents (mixtures.plan.retention_mask, distributed), with (docs, tokens)
    retained and documents held out per component."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    names = [c.name for c in spec.components]
    by_rank = [i for i, c in enumerate(spec.components) if c.retention.rule in ("top_fraction", "quantile_band",
                                                                                 "random_tokens")]
    eligible = annotated.filter(~F.col("held"))
    kept = eligible.filter(~F.col("comp").isin(by_rank)).withColumn("retained", F.col("rule_keep"))
    if by_rank:
        sub = eligible.filter(F.col("comp").isin(by_rank))
        is_random = F.col("comp").isin([i for i in by_rank if spec.components[i].retention.rule == "random_tokens"])
        # random_tokens: the seeded retention order; rank bands: the within-component order
        sub = (sub.withColumn("rorder_key", F.when(is_random, F.lit(0.0)).otherwise(F.col("key")))
                  .withColumn("rorder_tie", F.when(is_random, F.col("retain_key")).otherwise(F.col("order_tie"))))
        sub = with_prefix(sub, ["rorder_key", "rorder_tie", "uid"], group_col="comp", sums={"rprefix": "n"})
        comp_tokens = {r["comp"]: int(r["t"]) for r in sub.groupBy("comp").agg(F.sum("n").alias("t")).collect()}
        bc_tot = spark.sparkContext.broadcast(comp_tokens)

        def band(cols):
            def f(c, m):
                r = c.retention
                prefix = cols["rprefix"].to_numpy(np.int64)[m]
                if r.rule == "random_tokens":
                    return cm.take_budget(prefix, r.n_tokens)
                low, high = (1.0 - r.fraction, 1.0) if r.rule == "top_fraction" else (r.low, r.high)
                return cm.in_rank_band(prefix, bc_tot.value[int(cols["comp"].to_numpy()[m][0])], low, high)
            return {"retained": _per_component(cols, spec, f, bool)}

        sub = _map_columns(sub, [("retained", BooleanType())], band).drop("rorder_key", "rorder_tie", "rprefix")
        kept = kept.unionByName(sub)
    retained = freeze(kept.filter(F.col("retained")).drop("retained", "rule_keep"))
    stats = retained.groupBy("comp").agg(F.count("*").alias("d"), F.sum("n").alias("t")).collect()
    docs, tokens = _by_comp(stats, "d", names), _by_comp(stats, "t", names)
    counts = {n: (int(docs[n]), int(tokens[n])) for n in names}
    held = _by_comp(annotated.filter(F.col("held")).groupBy("comp").count().collect(), "count", names)
    return retained, counts, held


# ---- 5. phase pools ------------------------------------------------------------------------------

@dataclass
class PhasePool:
    """A phase's pool on the cluster: one row per (document, copy) with prefix, rank and bucket."""

    df: Any
    bucket_count: int
    totals: dict[int, int]                       # tokens used per component index
    details: dict[str, dict[str, Any]]


def _capped_masses(spec: MixtureSpec, rows, n_pass: int):
    """Copy caps (`cap`), the per-pass mass columns m1..m{n_pass} (`curriculum.extra_pass_masks`)
    and, in one aggregation, every component's capped supply and pass masses."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    def caps(cols):
        dup = cols["dup"].fillna(1).to_numpy(np.int64)
        return {"cap": _per_component(cols, spec, lambda c, m: cm.copy_caps(dup[m], c.repeat, c.max_copies)
                                      if c.dup_weighted else 1, np.int64)}

    rows = _map_columns(rows, [("cap", LongType())], caps)
    for j in range(1, n_pass + 1):
        rows = rows.withColumn(f"m{j}", F.when(F.col("cap") > j, F.col("n")).otherwise(F.lit(0)).cast("long"))
    agg = rows.groupBy("comp").agg(F.sum(F.col("n") * F.col("cap")).alias("supply"),
                                   *[F.sum(f"m{j}").alias(f"m{j}") for j in range(1, n_pass + 1)]).collect()
    supply = {spec.components[r["comp"]].name: int(r["supply"]) for r in agg
              if spec.components[r["comp"]].dup_weighted}
    masses = {r["comp"]: np.array([int(r[f"m{j}"]) for j in range(1, n_pass + 1)], dtype=np.int64) for r in agg}
    return rows, supply, masses


def phase_pool(spark, spec: MixtureSpec, pi: int, retained, retained_tokens: dict[str, int]) -> PhasePool:
    """Budgets, repetition, within-component rank and bucket (mixtures.plan.plan_phase_pool,
    distributed). The copy counts take one aggregation and one sort per phase: the number of
    passes is bounded by max_copies, never by the largest dup_count."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType

    p = spec.phases[pi]
    names = [c.name for c in spec.components]
    members = [names.index(n) for n in p.components]
    K = spec.bucket_count_of(p)
    weights = {n: s.weight for n, s in p.components.items()} if p.weighted else None
    budgets = {n: s.n_tokens for n, s in p.components.items()}
    repeatable = {n: spec.component(n).repeat != "none" for n in p.components}
    capped = [ci for ci in members if spec.components[ci].dup_weighted]
    n_pass = max((spec.components[ci].max_copies for ci in capped), default=1) - 1
    rows = retained.filter(F.col("comp").isin(members))
    supply, masses = {}, {}
    if capped:
        rows, supply, masses = _capped_masses(spec, rows, n_pass)
    try:
        b, _total = cm.phase_budgets({n: retained_tokens[n] for n in p.components}, weights, budgets, p.n_tokens,
                                     repeatable, supply)
    except ValueError as e:
        raise MixtureSpecError("<spec>", str(e), field=f"phases[{pi}].components") from None
    extra = {ci: b[names[ci]] - retained_tokens[names[ci]] for ci in members}
    pass_cols = [f"p{j}" for j in range(1, n_pass + 1)] if any(extra[ci] > 0 for ci in capped) else []
    if any(e != 0 for e in extra.values()):     # the budget order matters only when something is cut or repeated
        salt = f"budget:{p.name}"
        rows = _map_columns(rows, [("bkey", LongType())], lambda cols: {"bkey": _keys(cols, spec.seeds.budget, salt, False)})
        rows = with_prefix(rows, ["bkey", "uid"], group_col="comp",
                           sums={"bprefix": "n", **{c: f"m{j + 1}" for j, c in enumerate(pass_cols)}})
    else:
        rows = rows.withColumn("bprefix", F.lit(0).cast("long"))
    budget_tokens = {ci: b[names[ci]] for ci in members}

    def copies(cols):
        prefix = cols["bprefix"].to_numpy(np.int64)

        def f(c, m):
            ci = names.index(c.name)
            e = extra[ci]
            if e < 0:
                return cm.take_budget(prefix[m], budget_tokens[ci])
            if e == 0:
                return 1
            if c.dup_weighted:
                pp = np.stack([cols[col].to_numpy(np.int64)[m] for col in pass_cols], axis=1)
                return 1 + cm.capped_extra_copies(cols["cap"].to_numpy(np.int64)[m], pp, masses[ci], e)
            return 1 + cm.pass_copies(prefix[m], retained_tokens[c.name], e)
        return {"copies": _per_component(cols, spec, f, np.int64)}

    rows = _map_columns(rows, [("copies", LongType())], copies).filter(F.col("copies") > 0)
    rows = rows.withColumn("copy", F.explode(F.sequence(F.lit(0).cast("long"), F.col("copies") - 1)))
    rows = rows.drop("copies", "bkey", "bprefix", "cap", *[f"m{j}" for j in range(1, n_pass + 1)], *pass_cols)
    rows = _map_columns(rows, [("tie", LongType())], lambda cols: {"tie": _per_component(
        cols, spec, lambda c, m: _keys(cols[m], c.order_seed, "order"), np.int64)})
    # copy c is ranked within pass c (curriculum.preference_order)
    rows = with_prefix(rows, ["copy", "key", "tie", "uid"], group_col="comp")
    agg = rows.groupBy("comp").agg(F.sum("n").alias("t"), F.count("*").alias("d"),
                                   F.sum((F.col("copy") > 0).cast("long")).alias("rep")).collect()
    totals = {r["comp"]: int(r["t"]) for r in agg}
    bc_tot = spark.sparkContext.broadcast(totals)

    def rank_bucket(cols):
        tot = np.array([bc_tot.value[int(c)] for c in cols["comp"].to_numpy()], dtype=np.int64)
        prefix = cols["prefix"].to_numpy(np.int64)
        return {"rank": cm.rank_of(prefix, tot), "bucket": cm.bucket_of(prefix, tot, K)}

    df = freeze(_map_columns(rows, [("rank", DoubleType()), ("bucket", LongType())], rank_bucket).drop("tie"))
    details = {names[r["comp"]]: {"budget_tokens": b[names[r["comp"]]],
                                  "n_tokens_retained": retained_tokens[names[r["comp"]]], "n_tokens_used": int(r["t"]),
                                  "n_docs_used": int(r["d"]), "n_repeated_docs": int(r["rep"])} for r in agg}
    return PhasePool(df, K, totals, details)


def bucket_stats(spec: MixtureSpec, pool: PhasePool) -> list[CompositionStats]:
    """Per-bucket composition with exact integer rank sums (mixtures.plan.bucket_stats, distributed)."""
    from pyspark.sql import functions as F

    names = [c.name for c in spec.components]
    dec = "decimal(38,0)"
    rows = pool.df.groupBy("bucket", "comp").agg(
        F.sum("n").alias("t"), F.count("*").alias("d"),
        F.sum(F.col("prefix").cast(dec) * F.col("n").cast(dec)).alias("s")).collect()
    by_k: dict[int, list] = defaultdict(list)
    for r in rows:
        by_k[int(r["bucket"])].append(r)
    out = []
    for k in range(pool.bucket_count):
        tokens = {names[r["comp"]]: int(r["t"]) for r in by_k[k]}
        rank_sums = {names[r["comp"]]: (int(r["s"]) / pool.totals[r["comp"]] if pool.totals[r["comp"]] else 0.0)
                     for r in by_k[k]}
        out.append(composition_from_sums(cm.segment_name("curriculum", k), sum(tokens.values()),
                                         sum(int(r["d"]) for r in by_k[k]), tokens, rank_sums))
    return out


# ---- 6. streams ---------------------------------------------------------------------------------

def _label_col(spec: MixtureSpec, replay: bool):
    from pyspark.sql import functions as F

    expr = None
    for i, c in enumerate(spec.components):
        v = F.lit(("replay:" if replay else "") + c.name)
        expr = F.when(F.col("comp") == i, v) if expr is None else expr.when(F.col("comp") == i, v)
    return expr


def stream_plan(spec: MixtureSpec, phase: str, pool: PhasePool, order: str, prev_pool: PhasePool | None,
                prev_name: str | None):
    """mixtures.plan.plan_stream, distributed: PLAN_COLUMNS, the stream order being (seg_rank,
    ord_a, ord_b, ord_c, ord_d); the transition window is seg_rank -1 ordered by due position."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType

    p = spec.phase(phase)
    K = pool.bucket_count
    seed, salt = ((spec.seeds.bucket_shuffle, f"bucket:{p.name}") if order == "curriculum"
                  else (spec.seeds.uniform, f"uniform:{p.name}"))

    def keys(cols):
        h = cm.doc_keys(cols["uid"].to_numpy(object), seed, salt=salt, copies=cols["copy"].to_numpy(np.int64))
        seg = cols["bucket"].to_numpy(np.int64) if order == "curriculum" else cm.uniform_slot(h, K)
        return {"skey": cm.signed_order_key(h), "seg": seg}

    s = _map_columns(pool.df, [("skey", LongType()), ("seg", LongType())], keys).withColumn("label", _label_col(spec, False))
    seg_names = F.concat(F.lit("b" if order == "curriculum" else "u"), F.lpad(F.col("seg").cast("string"), 4, "0"))
    body = (s.withColumn("seg_rank", F.col("seg")).withColumn("segment", seg_names).withColumn("ord_a", F.lit(0.0))
             .withColumn("ord_b", F.col("skey")).withColumn("ord_c", F.col("uid")).withColumn("ord_d", F.col("copy")))
    L = p.transition_tokens
    if not (L and prev_pool is not None):
        return body.select(*PLAN_COLUMNS), {}
    body = with_prefix(body, ["seg_rank", *ORDER], sums={"sprefix": "n"})
    rsalt = f"replay:{p.name}"
    rep = _map_columns(prev_pool.df, [("replay_key", LongType())],
                       lambda cols: {"replay_key": _keys(cols, spec.seeds.replay, rsalt)})
    rep = with_prefix(rep, ["replay_key", "uid", "copy"], sums={"sprefix": "n"}).filter(F.col("sprefix") * 2 < F.lit(L))
    head = body.filter(F.col("sprefix") * 2 < F.lit(L))
    rest = body.filter(F.col("sprefix") * 2 >= F.lit(L)).select(*PLAN_COLUMNS)
    rep = (_map_columns(rep, [("ord_a", DoubleType())],
                        lambda cols: {"ord_a": cm.transition_p1_position(cols["sprefix"].to_numpy(np.int64), L)})
           .withColumn("label", _label_col(spec, True)).withColumn("bucket", F.lit(-1).cast("long"))
           .withColumn("ord_b", F.lit(0).cast("long")))
    head = (_map_columns(head.drop("ord_a"), [("ord_a", DoubleType())],
                         lambda cols: {"ord_a": cm.transition_p2_position(cols["sprefix"].to_numpy(np.int64), L)})
            .withColumn("ord_b", F.lit(1).cast("long")))
    side_cols = [c for c in PLAN_COLUMNS if c not in ("seg_rank", "segment", "ord_c", "ord_d")] + ["sprefix"]
    window = (rep.select(*side_cols).unionByName(head.select(*side_cols))
              .withColumn("seg_rank", F.lit(-1).cast("long")).withColumn("segment", F.lit(cm.segment_name("transition", 0)))
              .withColumn("ord_c", F.lit("")).withColumn("ord_d", F.col("sprefix")).select(*PLAN_COLUMNS))
    sides = {r["ord_b"]: int(r["t"] or 0) for r in window.groupBy("ord_b").agg(F.sum("n").alias("t")).collect()}
    r_tok, h_tok = sides.get(0, 0), sides.get(1, 0)
    extra = {"transition": {"from_phase": prev_name, "transition_tokens": int(L), "replay_tokens": int(r_tok),
                            "phase_tokens": int(h_tok), "window_tokens": int(r_tok + h_tok)}}
    return window.unionByName(rest), extra


def eval_plan(spec: MixtureSpec, docs):
    """mixtures.plan.plan_eval, distributed: the held-out documents in one seeded order."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    held = docs.filter(F.col("held")).withColumn("copy", F.lit(0).cast("long"))
    held = _map_columns(held, [("ekey", LongType())], lambda cols: {"ekey": _keys(cols, spec.seeds.holdout, "eval")})
    if spec.holdout is not None and spec.holdout.max_tokens:
        held = with_prefix(held, ["ekey", "uid"], sums={"eprefix": "n"}).filter(F.col("eprefix") < F.lit(spec.holdout.max_tokens))
    return (held.withColumn("label", _label_col(spec, False)).withColumn("bucket", F.lit(-1).cast("long"))
            .withColumn("rank", F.lit(float("nan"))).withColumn("seg_rank", F.lit(0).cast("long"))
            .withColumn("segment", F.lit(cm.segment_name("eval", 0))).withColumn("ord_a", F.lit(0.0))
            .withColumn("ord_b", F.col("ekey")).withColumn("ord_c", F.col("uid")).withColumn("ord_d", F.col("copy"))
            .select(*PLAN_COLUMNS))


# ---- 7. shard parts and 8. writing ----------------------------------------------------------------

def assign_parts(plan, shard_tokens: int):
    """`part`: the shard file inside the segment where the document's first token falls."""
    from pyspark.sql import functions as F

    plan = with_prefix(plan, ORDER, group_col="seg_rank", sums={"seg_prefix": "n"})
    return plan.withColumn("part", F.floor(F.col("seg_prefix") / F.lit(shard_tokens)).cast("long"))


class SpillFiles:
    """tokens(file, offset, n) from the task spill files, by positioned reads (at most
    MAX_OPEN_SPILL_FILES descriptors open, least recently used closed first). Spill files on an
    object store are fetched whole, once per executor, into its scratch directory (`local_spill`)."""

    def __init__(self, directory: str, dtype: np.dtype):
        self.directory, self.dtype = str(directory), dtype
        self._fds: dict[str, int] = {}

    def __call__(self, tfile: str, toff: int, n: int) -> np.ndarray:
        fd = self._fds.pop(tfile, None)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_SPILL_FILES:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(local_spill(self.directory, tfile), os.O_RDONLY)
        self._fds[tfile] = fd
        size = self.dtype.itemsize
        data = os.pread(fd, n * size, toff * size)
        if len(data) != n * size:
            raise ContractError(storage.join(self.directory, tfile), f"token spill is truncated at token {toff} "
                                f"(+{n}); delete the work directory and run again")
        return np.frombuffer(data, dtype=self.dtype)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def local_spill(directory: str, tfile: str) -> Path:
    """A local path holding spill file `tfile` of `directory`: itself on a filesystem, else a copy
    in the executor's own scratch directory (Spark's per-application directory, removed when the
    executor exits), downloaded whole under a temporary name, then renamed: tasks of one executor
    share it."""
    if not storage.is_remote(directory):
        return Path(directory) / tfile
    from pyspark import SparkFiles

    local = Path(SparkFiles.getRootDirectory()) / "spill" / tfile
    if not local.is_file():
        local.parent.mkdir(parents=True, exist_ok=True)
        fs, inner = storage.filesystem(storage.join(directory, tfile))
        tmp = local.with_name(f"{atomic.TMP_PREFIX}{tfile}.{uuid.uuid4().hex[:8]}")
        try:
            fs.get_file(inner, str(tmp))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
    return local


def write_files(spark, plan, token_dir, directory, vocab_size: int) -> list[ShardFile]:
    """Each task writes whole shard files (one per (segment, part)) with the shared writer into
    `directory` (an attempt: a shared directory, or an object-store prefix that the files are
    uploaded to once written locally); the plan rows are shuffled to them (metadata only) and
    each reads its documents' tokens."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    keys = ["seg_rank", "part"]
    columns = ["segment", "part", "seg_rank", "tfile", "toff", "n", "id", "label", "bucket", "rank", "copy"]
    rows = (plan.select(*columns, *ORDER)
            .repartition(2 * spark.sparkContext.defaultParallelism, *keys).sortWithinPartitions(*keys, *ORDER))
    dtype = token_dtype(vocab_size)
    schema = StructType([StructField("seg_rank", LongType()), StructField("part", LongType()),
                         StructField("shard", StringType())])
    out_schema = pa.schema([("seg_rank", pa.int64()), ("part", pa.int64()), ("shard", pa.string())])
    dest = str(directory)

    def fn(batches):
        tokens = SpillFiles(token_dir, dtype)
        local = storage.local_scratch(dest)
        local.mkdir(parents=True, exist_ok=True)

        def docs():
            for b in batches:
                yield from zip(*(b.column(c).to_pylist() for c in columns))
        try:
            for (segment, part, seg_rank), grp in groupby(docs(), key=lambda r: (r[0], r[1], r[2])):
                sf = write_shard_file(local, cm.shard_name(segment, part), segment,
                                      ((tokens(r[3], r[4], r[5]), r[6], r[7], r[8], r[9], r[10]) for r in grp),
                                      vocab_size)
                if storage.is_remote(dest):
                    upload(local, dest, [sf.tokens_path, sf.index_path])
                yield pa.RecordBatch.from_pydict({"seg_rank": [seg_rank], "part": [part],
                                                  "shard": [sf.model_dump_json()]}, schema=out_schema)
        finally:
            tokens.close()

    got = rows.mapInArrow(profiled(fn), schema).collect()
    got.sort(key=lambda r: (r["seg_rank"], r["part"]))
    return [ShardFile.model_validate_json(r["shard"]) for r in got]


def upload(local: Path, dest: str, names: list[str]) -> None:
    """Move files `names` of local directory `local` to object-store prefix `dest` (one PUT each:
    an object appears whole; a retried task puts the same bytes again)."""
    fs, inner = storage.filesystem(dest)
    for name in names:
        fs.put_file(str(local / name), f"{inner}/{name}")
        (local / name).unlink()


# ---- the job -------------------------------------------------------------------------------------

@dataclass
class Planned:
    """What every set's writing needs from tokenization and planning."""

    docs: Any                                    # annotated metadata of the valid documents
    pools: dict[str, PhasePool]
    records: dict[str, dict[str, Any]]
    retained: dict[str, tuple[int, int]]
    held_out: dict[str, int]
    sources: dict[str, str]
    paths: dict[str, str]


def plan_all(spark, spec: MixtureSpec, opened: dict[str, Component], meta, progress: Callable[[str], None]) -> Planned:
    """Steps 2-5: counts, held-out set, retention and every phase's pool."""
    from pyspark.sql import functions as F

    names = [c.name for c in spec.components]
    records = spill_records(meta, spec, opened)
    check_unique_ids(meta, spec, opened)
    sources = {c.name: opened[c.name].name for c in spec.components}
    docs = annotate(spark, spec, meta.filter(F.col("reason").isNull()).drop("reason"), sources)
    retained, counts, held = retain(spark, spec, docs)
    pools = {}
    for pi, p in enumerate(spec.phases):
        pools[p.name] = phase_pool(spark, spec, pi, retained, {n: counts[n][1] for n in names})
        progress(f"planned phase {p.name}: {sum(pools[p.name].totals.values()):,} tokens")
    return Planned(docs, pools, records, counts, held, sources, {n: str(opened[n].directory) for n in names})


def set_plan(spec: MixtureSpec, planned: Planned, phase: str | None, order: str):
    """The set's plan with shard parts, its manifest extras, bucket count and bucket table."""
    from pyspark.sql import functions as F

    if phase is None:
        names = [c.name for c in spec.components]
        firsts = [names.index(n) for n in eval_components(spec, planned.sources)]
        plan, extra, pool = eval_plan(spec, planned.docs.filter(F.col("comp").isin(firsts))), {}, None
    else:
        idx = [p.name for p in spec.phases].index(phase)
        prev = spec.phases[idx - 1] if idx > 0 and spec.phases[idx].transition_tokens else None
        pool = planned.pools[phase]
        plan, extra = stream_plan(spec, phase, pool, order, planned.pools[prev.name] if prev else None,
                                  prev.name if prev else None)
    return assign_parts(plan, spec.shard_tokens), extra, pool


def component_uses(spec: MixtureSpec, planned: Planned, plan, phase: str | None):
    """The manifest's per-component rows (mixtures.materialize.component_uses_from) from one aggregation."""
    from pyspark.sql import functions as F

    names = [c.name for c in spec.components]
    used: dict[str, tuple[int, int]] = {n: (0, 0) for n in names}
    present: set[str] = set()
    for r in plan.groupBy("comp", "label").agg(F.count("*").alias("d"), F.sum("n").alias("t")).collect():
        docs, tokens = used[names[r["comp"]]]
        used[names[r["comp"]]] = (docs + int(r["d"]), tokens + int(r["t"]))
        present.add(r["label"].removeprefix("replay:"))
    return component_uses_from(spec, phase, paths=planned.paths, records=planned.records, retained=planned.retained,
                               held_out=planned.held_out, used=used,
                               phase_details=planned.pools[phase].details if phase else None, present=present)


def write_set(spark, spec: MixtureSpec, tokenizer: Tokenizer, planned: Planned, out: Path, token_dir: Path,
              set_name: str, phase: str | None, order: str, inputs: list) -> ShardManifest:
    """One shard set through the commit protocol (`purokit.storage`): the tasks write its files
    into an attempt (a `.tmp-*` sibling directory, or `_attempt-<id>/` on an object store), then
    the manifest and run.json; the commit (a rename, or the commit record written last) makes it
    visible. A killed job leaves an attempt no reader sees; the next run removes it."""
    ts = time.perf_counter()
    plan, extra, pool = set_plan(spec, planned, phase, order)
    uses = component_uses(spec, planned, plan, phase)
    final = out / set_name
    attempt = storage.new_attempt(final)
    storage.makedirs(attempt)
    try:
        shards = write_files(spark, plan, token_dir, attempt, tokenizer.vocab_size)
        manifest = assemble_manifest(spec, tokenizer, set_name, phase, order, shards, uses, inputs, extra,
                                     bucket_count=pool.bucket_count if pool else None,
                                     buckets=bucket_stats(spec, pool) if pool else None)
        manifest.write(attempt)
        write_run_record(attempt, set_name, "spark", manifest, {"total": time.perf_counter() - ts})
        known = {f: sha for s in shards for f, sha in ((s.tokens_path, s.sha256), (s.index_path, s.index_sha256))}
        storage.commit(attempt, final, known)
    except BaseException:
        if not storage.is_remote(attempt):
            shutil.rmtree(attempt, ignore_errors=True)
        raise
    return manifest


def default_work_dir(spec: MixtureSpec, out):
    """Where the token spill (and, on a filesystem, the CLI's checkpoints) go unless told: beside
    the sets (on an object store too: executors write the spill there and read it back)."""
    return out / f".work-{spec.spec_hash()[:12]}-spark"


def run(spark, spec: MixtureSpec | str, out_dir: str | Path, *, sets: list[str] | None = None,
        work_dir: str | Path | None = None, keep_work: bool = False, force: bool = False,
        checkpoint_dir: str | Path | None = None, progress: Callable[[str], None] | None = None
        ) -> dict[str, ShardManifest]:
    """Materialize the spec's sets (all, or the named `sets`) under `out_dir/<set name>/`; sets
    complete from an earlier run with the same spec and inputs are reused unless `force`.
    `checkpoint_dir` makes the plan's checkpoints reliable (HDFS, a shared directory, or an object
    store the cluster's Hadoop connector reaches; else the context's `spark.checkpoint.dir`, else
    local checkpoints that a lost executor invalidates). `out_dir` and `work_dir` may be URLs
    (s3://, gs://, abfs://), and so may the components."""
    progress = progress or (lambda m: log.info(m))
    if not isinstance(spec, MixtureSpec):
        spec = load_spec(spec)
    out = resolve_location(out_dir)
    storage.makedirs(out)
    atomic.clean_stale_tmp(out)
    opened = check_components(spec)
    tokenizer = load_tokenizer(spec.tokenizer)
    inputs = fingerprints([c.directory / MANIFEST_NAME for c in opened.values()])
    results, todo = select_sets(spec, lambda name: out / name, inputs, sets=sets, force=force, progress=progress)
    if not todo:
        return results
    work = resolve_location(work_dir) if work_dir else default_work_dir(spec, out)
    storage.makedirs(work)
    if checkpoint_dir:
        spark.sparkContext.setCheckpointDir(str(checkpoint_dir))
    t0 = time.perf_counter()
    meta = tokenize(spark, spec, opened, tokenizer, work / "spill")
    progress(f"tokenized {len(spec.components)} components on executors in {time.perf_counter() - t0:.1f}s")
    planned = plan_all(spark, spec, opened, meta, progress)
    for i, (set_name, phase, order) in enumerate(todo, 1):
        ts = time.perf_counter()
        results[set_name] = m = write_set(spark, spec, tokenizer, planned, out, work / "spill" / "tokens", set_name,
                                          phase, order, inputs)
        note = set_progress(progress, i, len(todo))
        note(f"wrote {set_name}: {len(m.shards)} shards, {m.n_tokens:,} tokens, {m.n_docs:,} docs "
             f"in {time.perf_counter() - ts:.1f}s")
    if not keep_work:
        storage.remove_tree(work)
    return results


def resolve_location(p):
    """A URL as it is (`storage.path`), a local path made absolute (executors run elsewhere)."""
    return storage.path(p) if storage.is_remote(p) else Path(p).resolve()
