"""Reading and writing components (ARCHITECTURE.md contract 2) from Spark.

Writing: each Spark partition is written by pyarrow on its executor into the component's attempt
(`purokit.storage.new_attempt`: `<parent>/.tmp-<name>.<uuid>/` on POSIX, `<name>/_attempt-<id>/`
on an object store) as `part-<partition>.parquet`; side outputs (quarantine, removed duplicates)
go into `_`-prefixed subdirectories that the component reader skips, and
`purokit.component.finalize_component` writes the manifest and commits the attempt (rename, or
commit record). A later stage therefore sees either no component or a complete one. Reading a
component on an object store also happens on the executors, through pyarrow over fsspec (no
Hadoop S3A/GCS connector is needed). The rows of each file are
hash-partitioned and sorted by id and row groups are cut at fixed row counts, so the same input
and config give byte-identical files, in any process.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from purokit import storage
from purokit.component import Component, ComponentManifest, finalize_component
from purokit.errors import ContractError
from purokit.hashing import canonical_json, sha256_bytes
from purokit.manifest import InputFingerprint
from purokit.document import spark_col



def component_fingerprint(component: Component) -> InputFingerprint:
    """Fingerprint of a component from its manifest's file list (every file's sha256), so a
    consumer never re-reads the data to know whether its input changed."""
    files = [(f.path, f.sha256, f.n_bytes) for f in component.manifest.files]
    return InputFingerprint(
        path=str(component.directory),
        kind="component-manifest",
        digest=sha256_bytes(canonical_json(files).encode("utf-8")),
        n_files=len(files),
        n_bytes=sum(f.n_bytes for f in component.manifest.files),
    )


def list_components(stage_dir: Path) -> dict[str, Component]:
    """Complete components under a stage directory, by name (half-written `.tmp-*` ones and
    uncommitted attempts are invisible)."""
    out: dict[str, Component] = {}
    stage_dir = storage.path(stage_dir)
    if not stage_dir.is_dir():
        return out
    for d in sorted(stage_dir.iterdir(), key=lambda p: p.name):
        root = storage.committed(d) if d.is_dir() and not d.name.startswith((".", "_")) else None
        if root is not None and (root / "manifest.json").is_file():
            c = Component.open(d)
            out[c.name] = c
    return out


def read_component(spark, component: Component):
    """The component's documents as a DataFrame (only the files its manifest lists)."""
    return read_parquet(spark, component.paths)


def read_parquet(spark, files: list) -> Any:
    """Parquet files as a DataFrame: Spark's reader for local paths; on an object store, each
    file read by one task through pyarrow over fsspec."""
    paths = [str(p) for p in files]
    if not paths or not storage.is_remote(paths[0]):
        return spark.read.parquet(*paths)
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = _as_nullable(from_arrow_schema(storage.parquet_file(paths[0]).schema_arrow))
    return spark.range(0, len(paths), 1, numPartitions=len(paths)).mapInArrow(_file_reader(paths), schema)


def _as_nullable(dt):
    """Every field, element and value nullable, as Spark's own parquet reader makes them (so what
    is written back has the same schema, and bytes, as after `spark.read.parquet`)."""
    from pyspark.sql import types as T

    if isinstance(dt, T.StructType):
        return T.StructType([T.StructField(f.name, _as_nullable(f.dataType), True, f.metadata) for f in dt.fields])
    if isinstance(dt, T.ArrayType):
        return T.ArrayType(_as_nullable(dt.elementType), True)
    if isinstance(dt, T.MapType):
        return T.MapType(_as_nullable(dt.keyType), _as_nullable(dt.valueType), True)
    return dt


def _file_reader(paths: list[str]):
    def read(batches):
        for batch in batches:
            for idx in batch.column("id").to_pylist():
                yield from storage.parquet_file(paths[idx]).iter_batches()
    return read


def n_files_for(n_bytes: int, target_file_mb: float) -> int:
    return max(1, math.ceil(n_bytes / (target_file_mb * 2**20)))


def new_tmp_dir(final_dir: Path) -> Path:
    return storage.new_attempt(final_dir)


def map_in_arrow(df, fn, schema):
    """`df.mapInArrow(fn, schema)` that also works when column names contain dots (PySpark passes
    the input columns to the UDF unquoted, so `filter.x` would be read as a struct field): the
    columns go in under plain aliases and `fn` sees batches with the real names."""
    from pyspark.sql import functions as F

    names = list(df.columns)
    if not any("." in n or "`" in n for n in names):
        return df.mapInArrow(fn, schema)
    aliased = df.select(*[F.col(spark_col(n)).alias(f"_c{i}") for i, n in enumerate(names)])

    def renamed(batches):
        return fn(b.rename_columns(names) for b in batches)

    return aliased.mapInArrow(renamed, schema)


def write_sorted_parquet(df, directory: Path, n_files: int, sort_cols: tuple[str, ...] = ("id",),
                         already_partitioned: bool = False, row_group_rows: int = 50_000) -> int:
    """Hash-partition `df` into `n_files` by the sort columns, sort each partition, and write
    `part-<partition>.parquet` files; returns the rows written.

    The files are written by pyarrow on the executors (not by Spark's parquet writer, whose
    footers list encodings in an order that changes from one JVM to the next), with row groups
    cut at fixed row counts, so the same rows give the same bytes in any process. With
    `already_partitioned`, `df` is already hash-partitioned by the sort columns (its partitions
    become the files as they are, sorted within)."""
    cols = [spark_col(c) for c in sort_cols]
    part = df if already_partitioned else df.repartition(n_files, *cols)
    part = part.sortWithinPartitions(*cols)
    storage.makedirs(directory)
    written = map_in_arrow(part, _partition_writer(str(directory), row_group_rows), "part int, n_rows bigint").collect()
    if not written:                      # nothing to write: one empty file keeps the schema
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        with storage.open(storage.join(directory, "part-00000.parquet"), "wb") as fh:
            pq.write_table(to_arrow_schema(df.schema).empty_table(), fh, **PARQUET_OPTIONS)
    return sum(int(r["n_rows"]) for r in written)


PARQUET_OPTIONS = {"compression": "zstd", "compression_level": 3, "use_dictionary": True, "write_statistics": True}


def _partition_writer(directory: str, row_group_rows: int):
    def write(batches):
        import os
        import uuid

        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        pid = TaskContext.get().partitionId()
        final = storage.join(directory, f"part-{pid:05d}.parquet")
        # POSIX: temp + rename. Object store: straight to the part's name (an object appears whole
        # on close; the attempt prefix is invisible to readers until its commit record is written)
        remote = storage.is_remote(directory)
        tmp = final if remote else os.path.join(directory, f".part-{pid:05d}.{uuid.uuid4().hex}.tmp")
        sink = None
        writer = None
        pending: list = []
        n_pending = 0
        n_rows = 0

        def flush(rows: int):
            nonlocal pending, n_pending
            table = pa.Table.from_batches(pending).combine_chunks()
            writer.write_table(table.slice(0, rows), row_group_size=rows)
            rest = table.slice(rows)
            pending = rest.to_batches() if rest.num_rows else []
            n_pending = rest.num_rows

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                if writer is None:
                    sink = storage.open(tmp, "wb") if remote else tmp
                    writer = pq.ParquetWriter(sink, batch.schema, **PARQUET_OPTIONS)
                pending.append(batch)
                n_pending += batch.num_rows
                n_rows += batch.num_rows
                while n_pending >= row_group_rows:
                    flush(row_group_rows)
            if writer is not None:
                if n_pending:
                    flush(n_pending)
                writer.close()
                if not remote:
                    os.replace(tmp, final)      # a retried or speculative attempt writes the same bytes
        finally:
            if remote:
                if sink is not None:
                    sink.close()
            elif os.path.exists(tmp):
                os.unlink(tmp)
        if n_rows:
            yield pa.RecordBatch.from_pydict({"part": [pid], "n_rows": [n_rows]},
                                             schema=pa.schema([("part", pa.int32()), ("n_rows", pa.int64())]))

    return write


def row_group_rows_for(n_bytes: int, n_rows: int, target_bytes: int = 64 << 20) -> int:
    """Rows per row group so that a group holds about `target_bytes` (from the input's size)."""
    per_row = max(1.0, n_bytes / max(1, n_rows))
    return int(min(1_000_000, max(1000, target_bytes // per_row)))


def finalize(tmp_dir: Path, final_dir: Path, manifest_fields: dict[str, Any]) -> ComponentManifest:
    """Manifest + commit (the one component writer); removes `tmp_dir` on failure."""
    try:
        return finalize_component(tmp_dir, final_dir, manifest_fields)
    except BaseException:
        storage.remove_tree(tmp_dir)
        raise


def require_components(stage_dir: Path, names: Optional[list[str]] = None) -> dict[str, Component]:
    found = list_components(stage_dir)
    if not found:
        raise ContractError(stage_dir, "no complete components here (has the previous job run?)")
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise ContractError(stage_dir, f"no complete component for {missing} (found: {sorted(found)})")
        return {n: found[n] for n in names}
    return found
