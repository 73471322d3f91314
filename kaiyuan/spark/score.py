"""The score job: annotate every document of each component (never drop any).

Per source: the annotators that apply to it run in one vectorized pass (`mapInArrow`, one Arrow
batch of texts at a time); model files reach the executors through `SparkContext.addFile`, so
nothing assumes a shared filesystem. The component is re-partitioned by id into
`ceil(n_docs / rows_per_partition)` sorted partitions (at least one per input file) so the
per-document annotators use every core, and the output is byte-identical on a rerun.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from purokit import atomic
from purokit import storage
from purokit.component import Component, ComponentManifest
from purokit.document import FILTER_PREFIX, QUALITY_PREFIX, REASON_SUFFIX, spark_col
from purokit.hashing import sha256_bytes
from purokit.log import get_logger
from purokit.manifest import Stopwatch, fingerprints
from purokit.progress import Reporter
from kaiyuan import annotators as ann
from kaiyuan.config import RunConfig
from kaiyuan.spark import components_io as cio
from kaiyuan.spark.component_job import ComponentJob

log = get_logger("kaiyuan.score")

JOB = "kaiyuan.score"
BIG_FILE_BYTES = 1 << 30     # model files larger than this are fingerprinted by size and mtime


def _spark_type(t):
    import pyarrow as pa
    from pyspark.sql import types as T

    if pa.types.is_boolean(t):
        return T.BooleanType()
    if pa.types.is_floating(t):
        return T.DoubleType()
    if pa.types.is_integer(t):
        return T.LongType()
    if pa.types.is_string(t):
        return T.StringType()
    raise TypeError(f"no Spark type for {t}")


def ship_files(spark, annotators: list[ann.Annotator], staging: Path) -> dict[str, str]:
    """addFile every model file under a unique name (two models may share a base name); returns
    local real path -> shipped name. Spark registers a file under its resolved name, so the unique
    name is a hard link (a copy across filesystems), not a symlink."""
    names: dict[str, str] = {}
    for a in annotators:
        for path in a.files():
            real = os.path.realpath(path)
            if real in names:
                continue
            name = f"{sha256_bytes(real.encode())[:10]}-{os.path.basename(real)}"
            staging.mkdir(parents=True, exist_ok=True)
            link = staging / name
            if not link.exists():
                try:
                    os.link(real, link)
                except OSError:
                    shutil.copyfile(real, link)
            spark.sparkContext.addFile(str(link))
            names[real] = name
    return names


def annotate_fn(configs: list[Any], shipped: dict[str, str], out_names: list[str]):
    """The per-batch function: Arrow batch of documents -> the same batch plus annotation columns."""

    def run(batches):
        import pyarrow as pa
        from pyspark import SparkFiles

        def resolve(path: str) -> str:
            name = shipped.get(os.path.realpath(path))
            return SparkFiles.get(name) if name else path

        annotators = [ann.build(c) for c in configs]
        for a in annotators:
            a.setup(resolve)
        fields = [f for a in annotators for f in a.output_fields()]
        for batch in batches:
            texts = batch.column("text").to_pylist()
            values: dict[str, list] = {}
            for a in annotators:
                values.update(a.annotate(texts))
            arrays = list(batch.columns) + [pa.array(values[f.name], type=f.type) for f in fields]
            yield pa.RecordBatch.from_arrays(arrays, names=list(batch.schema.names) + [f.name for f in fields])

    return run


def job_config(source: str, cfg: RunConfig, annotators: list[ann.Annotator]) -> dict[str, Any]:
    return {"job": JOB, "source": source, "annotators": [a.describe() for a in annotators],
            "rows_per_partition": cfg.score.rows_per_partition}


def _stats(spark, tmp: Path, fields: list[str], top_reasons: int = 8) -> dict[str, Any]:
    """Pass rates, reasons, score quantiles and languages, read back from the written files in
    two Spark jobs (one aggregate; one count of every (filter, reason) and language)."""
    from pyspark.sql import functions as F

    df = cio.read_parquet(spark, sorted(tmp.glob("*.parquet")))
    out: dict[str, Any] = {"filters": {}, "scores": {}}
    filters = [f for f in fields if f.startswith(FILTER_PREFIX) and not f.endswith(REASON_SUFFIX)]
    scores = [f for f in fields if f.startswith(QUALITY_PREFIX)]
    aggs = [F.count("*").alias("n")]
    for i, f in enumerate(filters):
        c = F.col(spark_col(f))
        aggs += [F.sum(c.cast("long")).alias(f"f{i}_pass"), F.sum(c.isNull().cast("long")).alias(f"f{i}_error")]
    for i, f in enumerate(scores):
        c = F.col(spark_col(f))
        aggs += [F.mean(c).alias(f"s{i}_mean"), F.percentile_approx(c, [0.1, 0.25, 0.5, 0.75, 0.9], 1000).alias(f"s{i}_q")]
    if "n_tokens" in fields:
        aggs.append(F.sum("n_tokens").alias("n_tokens"))
    row = df.agg(*aggs).collect()[0].asDict()
    n = int(row["n"])
    # (kind, key) pairs: every filter's reason and the language, counted in one pass
    pairs = [F.struct(F.lit(f).alias("kind"), F.col(spark_col(f + REASON_SUFFIX)).alias("key")) for f in filters]
    if "lang" in fields:
        pairs.append(F.struct(F.lit("lang").alias("kind"), F.col("lang").alias("key")))
    counts: dict[str, list[tuple[str, int]]] = {}
    if pairs:
        exploded = df.select(F.explode(F.array(*pairs)).alias("p")).select("p.kind", "p.key").where(F.col("key").isNotNull())
        for r in exploded.groupBy("kind", "key").count().collect():
            counts.setdefault(r["kind"], []).append((r["key"], int(r["count"])))
    top = {k: sorted(v, key=lambda kv: (-kv[1], kv[0])) for k, v in counts.items()}
    for i, f in enumerate(filters):
        passed, errors = int(row[f"f{i}_pass"] or 0), int(row[f"f{i}_error"] or 0)
        out["filters"][f[len(FILTER_PREFIX):]] = {
            "pass": passed, "fail": n - passed - errors, "error": errors,
            "pass_rate": round(passed / n, 4) if n else None,
            "top_reasons": dict(top.get(f, [])[:top_reasons])}
    for i, f in enumerate(scores):
        q = row[f"s{i}_q"] or []
        out["scores"][f[len(QUALITY_PREFIX):]] = {"mean": round(float(row[f"s{i}_mean"] or 0.0), 4),
                                                  "quantiles": dict(zip(["p10", "p25", "p50", "p75", "p90"],
                                                                        [round(float(x), 4) for x in q]))}
    if "lang" in fields:
        out["languages"] = dict(top.get("lang", [])[:10])
    if "n_tokens" in fields:
        out["n_tokens"] = int(row["n_tokens"] or 0)
    out["docs"] = n
    return out


def score_component(spark, name: str, c: Component, cfg: RunConfig, annotators: list[ann.Annotator]) -> ComponentManifest:
    job = ComponentJob(JOB, cfg.stage_dir("score"))
    model_files = sorted({f for a in annotators for f in a.files()})
    inputs = [cio.component_fingerprint(c)]
    for f in model_files:
        inputs += fingerprints([f], content=os.path.getsize(f) < BIG_FILE_BYTES)
    config = job_config(name, cfg, annotators)
    done = job.complete(name, config, inputs)
    if done is not None:
        return done
    sw = Stopwatch()
    fields = [f for a in annotators for f in a.output_fields()]
    out_names = [f.name for f in fields]
    staging = storage.local_scratch(job.stage) / f"{atomic.TMP_PREFIX}files"
    tmp = job.attempt(name)
    try:
        with sw("annotate"):
            shipped = ship_files(spark, annotators, staging)
            df = cio.read_component(spark, c)
            df = df.select(*[spark_col(x) for x in df.columns if x not in out_names])
            n_parts = max(len(c.paths), math.ceil(c.manifest.n_docs / cfg.score.rows_per_partition))
            df = df.repartition(n_parts, "id").sortWithinPartitions("id")     # annotate in this order
            from pyspark.sql.types import StructType

            schema = StructType(list(df.schema.fields))      # a copy: .add() mutates, and df.schema is cached
            for f in fields:
                schema = schema.add(f.name, _spark_type(f.type), True)
            log.info("score %s: %d docs in %d partitions, annotators: %s", name, c.manifest.n_docs, n_parts,
                     ", ".join(f"{a.type_name}:{getattr(a.config, 'name', None) or getattr(a.config, 'filter', '')}" for a in annotators))
            out = cio.map_in_arrow(df, annotate_fn([a.config for a in annotators], shipped, out_names), schema)
            cio.write_sorted_parquet(out, tmp, n_parts, already_partitioned=True, row_group_rows=cio.row_group_rows_for(
                sum(f.n_bytes for f in c.manifest.files) * 3, c.manifest.n_docs))
        with sw("stats"):
            stats = _stats(spark, tmp, out_names)
    except BaseException:
        storage.remove_tree(tmp)
        raise
    counts = {"docs": stats.pop("docs"), **stats}
    tokenizers = [a.config for a in annotators if a.type_name == "token_count"]
    manifest = job.commit(tmp, name, config=config, inputs=inputs, origin=c, counts=counts,
                          timings_s=sw.timings_s, outputs=[], n_tokens=counts.get("n_tokens"),
                          tokenizer=tokenizers[0].tokenizer if tokenizers else None)
    for f, s in counts["filters"].items():
        log.info("score %s: filter %-18s pass %5.1f%%  %s", name, f, 100 * (s["pass_rate"] or 0), s["top_reasons"])
    for f, s in counts["scores"].items():
        log.info("score %s: quality.%s mean %.3f quantiles %s", name, f, s["mean"], s["quantiles"])
    return manifest


def run_score(spark, cfg: RunConfig, only: Optional[list[str]] = None) -> dict[str, ComponentManifest]:
    components = cio.require_components(cfg.score_input_dir(), only)
    built = [ann.build(c) for c in cfg.score.annotators]
    for a in built:
        unknown = [s for s in (a.config.sources or []) if s not in components and not only]
        if unknown:
            log.warning("annotator %s names sources with no component: %s", a.type_name, unknown)
    if not any(a.config.type == "datatrove" and a.config.filter == "c4_badwords" for a in built):
        log.info("score: C4 bad-words filter not configured (datatrove downloads its list at run time; "
                 "add {type: datatrove, filter: c4_badwords, words_file: <local list>} to use it)")
    ComponentJob(JOB, cfg.stage_dir("score")).clean_stale()
    results = {}
    progress = Reporter(len(components), unit="component", mode="line")
    for i, (name, c) in enumerate(sorted(components.items()), 1):
        mine = [a for a in built if a.applies_to(name)]
        results[name] = score_component(spark, name, c, cfg, mine)
        progress.update(i, f"scored {name}: {c.manifest.n_docs:,} documents")
    shutil.rmtree(storage.local_scratch(cfg.stage_dir("score")) / f"{atomic.TMP_PREFIX}files", ignore_errors=True)
    return results
