"""Run manifests: what a job read, with which config and code, what it wrote, counts and timings.

Every job ends by writing `manifest.json` atomically into its output directory (local or an
object-store URL; see `purokit.storage` for the commit protocol). A job that finds a complete,
committed manifest there for the same inputs and config skips its work (`find_complete`).

Each contract file carries `schema` ("<kind>/<version>") and is validated on read; subclasses of
`RunManifest` add their own fields (the component manifest in `purokit.component`, the shard
manifest in `mixtures`, ...).
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import Field

from purokit import atomic, storage
from purokit.config import StrictModel, load_contract
from purokit.errors import ContractError
from purokit.hashing import config_hash, fingerprint
from purokit.version import code_version

MANIFEST_NAME = "manifest.json"

M = TypeVar("M", bound="RunManifest")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class InputFingerprint(StrictModel):
    path: str
    kind: str
    digest: str
    n_files: int
    n_bytes: int


class RunManifest(StrictModel):
    """Fields shared by every manifest. Subclasses set SCHEMA and add their own fields."""

    SCHEMA: ClassVar[str] = "run/1"

    schema_: str = Field(alias="schema")
    job: str
    status: str = "complete"            # "complete" is the only status ever written to disk
    created_at: str = Field(default_factory=utc_now)
    code_version: str = Field(default_factory=code_version)
    config: dict[str, Any] = Field(default_factory=dict)
    config_hash: str = ""
    inputs: list[InputFingerprint] = Field(default_factory=list)
    counts: dict[str, Any] = Field(default_factory=dict)
    timings_s: dict[str, float] = Field(default_factory=dict)
    outputs: list[str] = Field(default_factory=list)

    def __init__(self, **data: Any):
        data.setdefault("schema", self.SCHEMA)
        super().__init__(**data)
        if not self.config_hash:
            self.config_hash = config_hash(self.config)

    # ---- I/O -------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    def write(self, directory: str | os.PathLike) -> Path:
        path = storage.path(directory) / MANIFEST_NAME
        atomic.write_json(path, self.to_json_dict())
        return path

    @classmethod
    def read(cls: type[M], path: str | os.PathLike) -> M:
        """Read and validate; `path` is the manifest file or its (committed) directory."""
        path = storage.path(path)
        if path.is_dir():
            path = (storage.committed(path) or path) / MANIFEST_NAME
        return load_contract(cls, path, cls.SCHEMA, "no manifest here (the job that writes it has not finished)")


def fingerprints(paths: list[str | os.PathLike], content: bool = True) -> list[InputFingerprint]:
    return [InputFingerprint(**fingerprint(p, content=content)) for p in paths]


def find_complete(
    directory: str | os.PathLike,
    manifest_cls: type[M],
    config: Any,
    inputs: list[InputFingerprint] | None = None,
) -> M | None:
    """The manifest in `directory` if it records a finished run of the same config and inputs."""
    root = storage.committed(directory)
    path = root / MANIFEST_NAME if root is not None else None
    if path is None or not path.is_file():
        return None
    try:
        found = manifest_cls.read(path)
    except ContractError:
        return None
    if found.status != "complete" or found.config_hash != config_hash(config):
        return None
    if inputs is not None:
        want = sorted((i.path, i.digest) for i in inputs)
        have = sorted((i.path, i.digest) for i in found.inputs)
        if want != have:
            return None
    return found


class Stopwatch:
    """Collects named timings for a manifest: `with sw("dedup"): ...`."""

    def __init__(self) -> None:
        self.timings_s: dict[str, float] = {}

    def __call__(self, name: str) -> "_Lap":
        return _Lap(self, name)


class _Lap:
    def __init__(self, sw: Stopwatch, name: str):
        self.sw, self.name = sw, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.sw.timings_s[self.name] = round(self.sw.timings_s.get(self.name, 0.0) + time.perf_counter() - self.t0, 3)
