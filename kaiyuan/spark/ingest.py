"""The ingest job: raw sources -> one component per source, plus its quarantine.

For each source: discover files, plan splits (byte ranges of big jsonl files are numbered by a
first pass that counts newlines on the executors), read every split on the executors with
`kaiyuan.readers.read_split`, quarantine records with duplicate ids (the first by origin stays),
and write the documents and the quarantine (`_quarantine/` inside the component) atomically.
"""

from __future__ import annotations

from typing import Any, Optional

from purokit.component import ComponentManifest
from purokit.log import get_logger
from purokit.manifest import Stopwatch, fingerprints
from purokit.progress import Reporter
from kaiyuan import readers
from kaiyuan.config import RunConfig, SourceConfig
from kaiyuan.spark import components_io as cio
from kaiyuan.spark.component_job import ComponentJob

log = get_logger("kaiyuan.ingest")

JOB = "kaiyuan.ingest"
COUNTER = "_"               # prefix of the pseudo-reasons of per-split counter rows (never written):
                            # `_blank_lines`, `_unchecked_members` (zstd frames without a checksum)


def job_config(source: SourceConfig, cfg: RunConfig) -> dict[str, Any]:
    """What decides whether a finished ingest of this source can be reused."""
    return {"job": JOB, "source": source.model_dump(mode="json"), "ingest": cfg.ingest.model_dump(mode="json")}


def _read_splits_fn(splits: list[readers.Split], opts: readers.ReadOptions):
    """mapInArrow body over `spark.range(len(splits))`: each index names the split to read."""
    def read_splits(batches):
        import pyarrow as pa

        for batch in batches:
            for idx in batch.column("id").to_pylist():
                split = splits[idx]
                counters: dict[str, int] = {}
                yield from readers.read_split(split, opts, counters)
                for name, n in sorted(counters.items()):
                    row = {f.name: [None] for f in readers.INGEST_SCHEMA}
                    row.update(source=[split.source], origin_file=[split.path],
                               origin_line=[n], reason=[COUNTER + name])
                    yield pa.RecordBatch.from_pydict(row, schema=readers.INGEST_SCHEMA)
    return read_splits


def _count_newlines_fn(splits: list[readers.Split]):
    def count(batches):
        import pyarrow as pa

        for batch in batches:
            idx = batch.column("id").to_pylist()
            yield pa.RecordBatch.from_pydict({
                "idx": idx,
                "n": [readers.count_newlines(splits[i].path, splits[i].start, splits[i].end) for i in idx],
            })
    return count


def _one_task_per_split(spark, n: int):
    """A JVM-side DataFrame of split indices, one per partition (no Python needed to build it)."""
    return spark.range(0, n, 1, numPartitions=max(1, n))


def ingest_source(spark, source: SourceConfig, cfg: RunConfig, progress=None) -> ComponentManifest:
    """One source as a component: discover its files (skipped when a complete component has the same
    config and file fingerprints), plan and number its splits, read them once, write the documents
    (the first record of each id) and the quarantine, commit."""
    job = ComponentJob(JOB, cfg.stage_dir("ingest"))
    sw = Stopwatch()
    with sw("discover"):
        files = readers.discover_files(source.paths, source.format, source.hf_split, source.hf_config)
        inputs = fingerprints([f.path for f in files], content=cfg.ingest.fingerprint == "content")
    config = job_config(source, cfg)
    done = job.complete(source.name, config, inputs)
    if done is not None:
        return done
    job.clean_stale()
    total_bytes = sum(f.size for f in files)
    splits = readers.plan_splits(source.name, files, cfg.ingest.split_bytes)
    log.info("ingest %s: %d files, %.1f MB, %d splits", source.name, len(files), total_bytes / 1e6, len(splits))
    with sw("number_lines"):
        splits = number_splits(spark, splits)
    tmp = job.attempt(source.name)
    with sw("read"):
        records, tally = read_records(spark, splits, source, cfg)
    counted = {k[len(COUNTER):]: int(tally.pop(k)[1] or 0) for k in sorted(tally, key=str)
               if k is not None and k.startswith(COUNTER)}
    with sw("write"):
        n_docs, reasons = write_documents(records, tally, tmp, total_bytes, cfg)
    counts = {
        "records": n_docs + sum(reasons.values()),
        "documents": n_docs,
        "quarantined": sum(reasons.values()),
        "quarantine_reasons": dict(sorted(reasons.items())),
        "blank_lines": counted.get("blank_lines", 0),
        **({"unchecked_members": counted["unchecked_members"]} if counted.get("unchecked_members") else {}),
        "files": len(files),
        "splits": len(splits),
    }
    records.unpersist()
    manifest = job.commit(tmp, source.name, config=config, inputs=inputs, origin=source, counts=counts,
                          timings_s=sw.timings_s, outputs=["_quarantine"] if reasons else [],
                          expect_docs=counts["documents"])
    log.info("ingest %s: %d documents, %d quarantined %s, in %.1fs", source.name, manifest.n_docs,
             counts["quarantined"], counts["quarantine_reasons"] or "", sum(sw.timings_s.values()))
    return manifest


def number_splits(spark, splits: list[readers.Split]) -> list[readers.Split]:
    """The splits with their first line numbers: the byte ranges of uncompressed jsonl files are
    counted on the executors (`readers.count_newlines`)."""
    ranged = [s for s in splits if s.format == "jsonl" and s.compression is None and s.end >= 0]
    if not ranged:
        return splits
    counts = (_one_task_per_split(spark, len(ranged))
              .mapInArrow(_count_newlines_fn(ranged), "idx bigint, n bigint").collect())
    return readers.number_lines(splits, {(ranged[r["idx"]].path, ranged[r["idx"]].start): r["n"] for r in counts})


def read_records(spark, splits: list[readers.Split], source: SourceConfig, cfg: RunConfig):
    """(records, tally): every split read once on the executors (`readers.read_split`), kept on local
    disk (a split of raw text can be far larger than an executor's heap) for the two writes; and the
    records per reason (None: a document; `_`-prefixed: per-split counters) as (rows, sum of lines)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    opts = readers.ReadOptions(text_field=source.text_field, id_field=source.id_field,
                               max_text_bytes=cfg.ingest.max_text_bytes, raw_prefix_chars=cfg.ingest.raw_prefix_chars)
    records = _one_task_per_split(spark, len(splits)).mapInArrow(_read_splits_fn(splits, opts),
                                                                   readers.INGEST_SPARK_SCHEMA)
    records = records.persist(StorageLevel.DISK_ONLY)
    tally = {r["reason"]: (r["n"], r["lines"]) for r in
             records.groupBy("reason").agg(F.count("*").alias("n"), F.sum("origin_line").alias("lines")).collect()}
    return records, tally


def write_documents(records, tally: dict, tmp, total_bytes: int, cfg: RunConfig) -> tuple[int, dict[str, int]]:
    """(documents written, quarantined records per reason): the first record of each id (by origin)
    as the component's documents; the records with a reason, and the later records of a repeated id
    (`duplicate_id`, naming where it was first seen), in `_quarantine/`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    n_files = cio.n_files_for(total_bytes, cfg.ingest.target_file_mb)
    n_records = sum(int(v[0]) for v in tally.values())
    w = Window.partitionBy("id").orderBy("origin_file", "origin_line")
    ranked = (records.where(F.col("reason").isNull()).repartition(n_files, "id")
              .withColumn("_rank", F.row_number().over(w))
              .withColumn("_first", F.first(F.concat_ws(":", "origin_file", F.col("origin_line").cast("string"))).over(w)))
    good = ranked.where(F.col("_rank") == 1).select("id", "text", "source", "meta")
    n_written = cio.write_sorted_parquet(good, tmp, n_files, already_partitioned=True,
                                         row_group_rows=cio.row_group_rows_for(total_bytes, max(1, n_records)))
    n_dup = int(tally.get(None, (0, 0))[0]) - n_written      # later occurrences of a repeated id
    reasons = {k: int(v[0]) for k, v in tally.items() if k is not None}
    if n_dup:
        reasons["duplicate_id"] = n_dup
    if reasons:
        bad = records.where(F.col("reason").isNotNull() & ~F.col("reason").startswith(COUNTER)).drop("id", "text", "meta")
        if n_dup:            # only then is the ranking computed a second time
            bad = bad.unionByName(ranked.where(F.col("_rank") > 1).select(
                "source", "origin_file", "origin_line", F.lit("duplicate_id").alias("reason"),
                F.concat(F.lit("id "), F.col("id"), F.lit(" first seen at "), F.col("_first")).alias("detail"),
                F.substring("text", 1, cfg.ingest.raw_prefix_chars).alias("raw_prefix")))
        cio.write_sorted_parquet(bad, tmp / "_quarantine", max(1, n_files // 4), sort_cols=("origin_file", "origin_line"))
    return n_written, reasons


def run_ingest(spark, cfg: RunConfig, only: Optional[list[str]] = None) -> dict[str, ComponentManifest]:
    if not cfg.sources:
        raise ValueError("the run config lists no sources to ingest")
    sources = [s for s in cfg.sources if not only or s.name in only]
    out = {}
    progress = Reporter(len(sources), unit="source", mode="line")
    for i, source in enumerate(sources, 1):
        out[source.name] = m = ingest_source(spark, source, cfg)
        progress.update(i, f"ingested {source.name}: {m.n_docs:,} documents")
    return out
