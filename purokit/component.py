"""The Component contract (ARCHITECTURE.md contract 2): a directory of Document parquet files for
one source plus `manifest.json`.

One writer (`finalize_component`) and one reader (`Component.open`). Spark jobs write their part
files into an attempt directory (`purokit.storage.new_attempt`) and call `finalize_component`, which
checks the schema, records every file's rows, bytes and sha256, writes the manifest, and commits
the attempt: a rename on POSIX, the commit record on an object store (`purokit.storage`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as pads

from purokit import storage
from purokit.config import StrictModel
from purokit.document import DOCUMENT_SCHEMA_VERSION, schema_problems
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.manifest import MANIFEST_NAME, RunManifest

COMPONENT_SCHEMA = "component/1"


class ComponentFile(StrictModel):
    path: str          # relative to the component directory
    n_rows: int
    n_bytes: int
    sha256: str


class ComponentManifest(RunManifest):
    """A run manifest plus what a reader of the component needs to know."""

    SCHEMA = COMPONENT_SCHEMA
    name: str                                   # the source / component name
    document_schema: str = DOCUMENT_SCHEMA_VERSION
    files: list[ComponentFile]
    columns: dict[str, str]                     # column -> arrow type
    n_docs: int
    n_tokens: int | None = None
    tokenizer: str | None = None                # what n_tokens was counted with
    license: str | None = None
    source_identifier: str | None = None
    source_revision: str | None = None
    lineage: list[dict[str, Any]] = []          # earlier stages: {job, config_hash, code_version, manifest}


def _is_spark_junk(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name == "_SUCCESS" or name.endswith(".crc")


def finalize_component(
    tmp_dir: str | os.PathLike,
    final_dir: str | os.PathLike,
    manifest_fields: dict[str, Any],
) -> ComponentManifest:
    """Turn a directory of freshly written Document parquet files into a component, atomically.

    `manifest_fields` holds everything except files/columns/n_docs, which are measured here.
    Spark's `_SUCCESS` and `.crc` files are removed. Paths may be local or object-store URLs.
    """
    tmp_dir, final_dir = storage.path(tmp_dir), storage.path(final_dir)
    for rel, _, _ in storage.list_files(tmp_dir, hidden=True):
        if _is_spark_junk(rel):
            storage.remove_tree(tmp_dir / rel)
    files = [(rel, n_bytes) for rel, n_bytes, _ in storage.list_files(tmp_dir) if rel.endswith(".parquet")]
    schema: pa.Schema | None = None
    entries: list[ComponentFile] = []
    n_docs = 0
    for rel, n_bytes in files:
        f = tmp_dir / rel
        meta = storage.parquet_metadata(f)
        file_schema = meta.schema.to_arrow_schema()
        if schema is None:
            schema = file_schema
        problems = schema_problems(file_schema)
        if problems:
            raise ContractError(f, "not a Document file: " + "; ".join(problems))
        entries.append(ComponentFile(path=rel, n_rows=meta.num_rows, n_bytes=n_bytes, sha256=sha256_file(f)))
        n_docs += meta.num_rows
    if schema is None:
        raise ContractError(tmp_dir, "no parquet files were written")
    manifest = ComponentManifest(
        files=entries,
        columns={f.name: str(f.type) for f in schema},
        n_docs=n_docs,
        **manifest_fields,
    )
    manifest.write(tmp_dir)
    storage.commit(tmp_dir, final_dir, known_sha256={e.path: e.sha256 for e in entries})
    return manifest


class Component:
    """A validated, read-only view of a component directory (local or on an object store).

    `directory` is where its committed files are: the directory itself on POSIX, its committed
    attempt (`<location>/_attempt-<id>`) on an object store; `location` is what it was opened as."""

    def __init__(self, directory: Path, manifest: ComponentManifest, location: Path | None = None):
        self.directory = directory
        self.manifest = manifest
        self.location = directory if location is None else location

    @classmethod
    def open(cls, directory: str | os.PathLike, verify_hashes: bool = False) -> "Component":
        location = storage.path(directory)
        root = storage.committed(location)
        if root is None:
            raise ContractError(location, "component directory not found (or nothing committed there)")
        manifest = ComponentManifest.read(root / MANIFEST_NAME)
        for entry in manifest.files:
            p = root / entry.path
            if not p.is_file():
                raise ContractError(root / MANIFEST_NAME, f"lists {entry.path}, which is missing", field="files")
            size = p.stat().st_size
            if size != entry.n_bytes:
                raise ContractError(p, f"is {size} bytes, the manifest says {entry.n_bytes} (truncated or rewritten)")
            if verify_hashes and sha256_file(p) != entry.sha256:
                raise ContractError(p, "sha256 does not match the manifest (corrupted)")
        return cls(root, manifest, location)

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def paths(self) -> list[Path]:
        return [self.directory / f.path for f in self.manifest.files]

    @property
    def columns(self) -> list[str]:
        return list(self.manifest.columns)

    def require_column(self, column: str, purpose: str = "") -> None:
        if column not in self.manifest.columns:
            why = f" ({purpose})" if purpose else ""
            raise ContractError(self.directory / MANIFEST_NAME,
                                f"has no column '{column}'{why}; columns: {', '.join(self.columns)}", field="columns")

    def dataset(self) -> pads.Dataset:
        if storage.is_remote(self.directory):
            fs, _ = storage.arrow_filesystem(self.directory)
            return pads.dataset([storage.filesystem(p)[1] for p in self.paths], format="parquet", filesystem=fs)
        return pads.dataset([str(p) for p in self.paths], format="parquet")

    def read(self, columns: list[str] | None = None) -> pa.Table:
        return self.dataset().to_table(columns=columns)

    def iter_batches(self, columns: list[str] | None = None, batch_size: int = 8192) -> Iterator[pa.RecordBatch]:
        """Stream the component in file order (the order recorded in the manifest)."""
        for p in self.paths:
            yield from storage.parquet_file(p).iter_batches(batch_size=batch_size, columns=columns)
