"""Reading and writing components (ARCHITECTURE.md contract 2) from Spark.

Writing: Spark writes part files into `<parent>/.tmp-<name>.<uuid>/`; part files are renamed to
`part-<partition>.parquet` (Spark's names carry a random job id), side outputs (quarantine,
removed duplicates) go into `_`-prefixed subdirectories that the component reader skips, and
`common.component.finalize_component` writes the manifest and renames the directory into place.
A later stage therefore sees either no component or a complete one. The rows of each file are
hash-partitioned and sorted by id, so the same input and config give byte-identical files.
"""

from __future__ import annotations

import math
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Optional

from common import atomic
from common.component import Component, ComponentManifest, finalize_component
from common.errors import ContractError
from common.hashing import canonical_json, sha256_bytes
from common.manifest import InputFingerprint
from common.document import spark_col

_PART = re.compile(r"^part-(\d+)-.*?(\.[a-z0-9]+)?\.parquet$")


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
    """Complete components under a stage directory, by name (half-written `.tmp-*` ones are invisible)."""
    out: dict[str, Component] = {}
    if not stage_dir.is_dir():
        return out
    for d in sorted(stage_dir.iterdir()):
        if d.is_dir() and not d.name.startswith((".", "_")) and (d / "manifest.json").is_file():
            c = Component.open(d)
            out[c.name] = c
    return out


def read_component(spark, component: Component):
    """The component's documents as a DataFrame (only the files its manifest lists)."""
    return spark.read.parquet(*[str(p) for p in component.paths])


def n_files_for(n_bytes: int, target_file_mb: float) -> int:
    return max(1, math.ceil(n_bytes / (target_file_mb * 2**20)))


def new_tmp_dir(final_dir: Path) -> Path:
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    return final_dir.parent / f"{atomic.TMP_PREFIX}{final_dir.name}.{uuid.uuid4().hex[:12]}"


def write_sorted_parquet(df, directory: Path, n_files: int, sort_cols: tuple[str, ...] = ("id",)) -> None:
    """Hash-partition `df` into `n_files` by the sort columns, sort each file, write, and give
    the part files deterministic names."""
    cols = [spark_col(c) for c in sort_cols]
    (df.repartition(n_files, *cols).sortWithinPartitions(*cols)
       .write.mode("error").parquet(str(directory)))
    rename_parts(directory)


def rename_parts(directory: Path) -> None:
    for f in sorted(directory.iterdir()):
        m = _PART.match(f.name)
        if m:
            f.rename(directory / f"part-{int(m.group(1)):05d}.parquet")
        elif f.name == "_SUCCESS" or f.name.endswith(".crc"):
            f.unlink()


def finalize(tmp_dir: Path, final_dir: Path, manifest_fields: dict[str, Any]) -> ComponentManifest:
    """Manifest + atomic rename (the one component writer); removes `tmp_dir` on failure."""
    try:
        return finalize_component(tmp_dir, final_dir, manifest_fields)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def rows_written(directory: Path) -> int:
    """Rows in the parquet files just written to `directory` (from their footers; no Spark job)."""
    import pyarrow.parquet as pq

    if not directory.is_dir():
        return 0
    return sum(pq.read_metadata(p).num_rows for p in sorted(directory.glob("*.parquet")))


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
