"""proxy_eval's small files, each a versioned contract with one writer and one reader.

Run manifests (`manifest.json`) are `purokit.manifest.RunManifest` subclasses (`SlicePlan`,
`SliceRunManifest`, `ProxyRunManifest`); the other files a run leaves are these:

| file                                   | schema                      | written by                  |
|----------------------------------------|-----------------------------|-----------------------------|
| `<trainer run dir>/proxy-run-key.json` | `proxy_eval.run_key/1`      | `run.claim_run_dir`         |
| `<out>/base/sample/sample.json`        | `proxy_eval.base_sample/1`  | `ProxyRunner.base_samples`  |
| `<out>/base/eval/results.json`         | `proxy_eval.base_results/1` | `ProxyRunner.base_results`  |
| `<eval dir>/results.json`              | `proxy_eval.results/1`      | `evaluate.SuiteResult.write`|
| `<out>/pca.json`                       | `proxy_eval.pca/1`          | `python -m proxy_eval pca`  |
| `<out>/track.json`                     | `proxy_eval.track/1`        | `python -m proxy_eval track`|

`read` checks the schema and validates (a `ContractError` naming the file and field);
`read_current` is the reuse check: None when the file is missing, of another version or does not
validate, so the work it records is simply done again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import ConfigDict, Field

from purokit import atomic
from purokit.config import StrictModel, validate
from purokit.errors import ContractError

F = TypeVar("F", bound="VersionedFile")


class VersionedFile(StrictModel):
    """A JSON file with a `schema` field naming its contract and version."""

    model_config = ConfigDict(populate_by_name=True)
    SCHEMA: ClassVar[str] = ""
    schema_: str = Field(alias="schema")

    def __init__(self, **data: Any):
        data.setdefault("schema", self.SCHEMA)
        super().__init__(**data)

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        atomic.write_json(path, self.model_dump(mode="json", by_alias=True))
        return path

    @classmethod
    def read(cls: type[F], path: str | os.PathLike) -> F:
        path = Path(path)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ContractError(path, f"no {cls.SCHEMA} file here") from None
        except json.JSONDecodeError as e:
            raise ContractError(path, f"not valid JSON ({e})") from None
        if not isinstance(raw, dict) or raw.get("schema") != cls.SCHEMA:
            got = raw.get("schema") if isinstance(raw, dict) else type(raw).__name__
            raise ContractError(path, f"schema is {got!r}, this reader expects {cls.SCHEMA!r}", field="schema")
        return validate(cls, raw, path)

    @classmethod
    def read_current(cls: type[F], path: str | os.PathLike) -> F | None:
        try:
            return cls.read(path)
        except ContractError:
            return None


class RunKey(VersionedFile):
    """What a trainer run directory was made for (configuration and data): another key, or none,
    and the directory is started again instead of resumed."""

    SCHEMA: ClassVar[str] = "proxy_eval.run_key/1"
    key: str


class BaseSample(VersionedFile):
    """The seeded per-component samples the base is trained on, disjoint from slices and evals."""

    SCHEMA: ClassVar[str] = "proxy_eval.base_sample/1"
    key: str
    budget_tokens: int
    excluded_docs: int


class BaseResults(VersionedFile):
    """The base checkpoint's suite results (profile rows), keyed by checkpoint and suite."""

    SCHEMA: ClassVar[str] = "proxy_eval.base_results/1"
    key: str
    rows: list[dict[str, Any]]


class SuiteResults(VersionedFile):
    """One model's scores on a suite: per task metric, value, stderr, n, every sub-metric."""

    SCHEMA: ClassVar[str] = "proxy_eval.results/1"
    suite: str
    model: str
    batch_size: int
    tasks: list[dict[str, Any]]

    def rows(self, name: str | None = None) -> list[dict[str, Any]]:
        """Profile rows, the slice named `name` (default: the model's name)."""
        keys = ("task", "group", "format", "metric", "value", "stderr", "n", "higher_is_better")
        return [{"slice": name or self.model, **{k: t[k] for k in keys}} for t in self.tasks]


class PcaFile(VersionedFile):
    """z-scored PCA of capability vectors (`proxy_eval.pca.PCAResult.to_dict`)."""

    SCHEMA: ClassVar[str] = "proxy_eval.pca/1"
    level: str
    rows: list[str]
    variables: list[str]
    dropped: list[str]
    explained_variance_ratio: list[float]
    loadings: dict[str, list[float]]
    scores: dict[str, list[float]]
    mean: dict[str, float]
    std: dict[str, float]


class TrackFile(VersionedFile):
    """Merge-tracking points along a trainer run and the best merge at each end step."""

    SCHEMA: ClassVar[str] = "proxy_eval.track/1"
    shape: str
    windows: list[int]
    points: list[dict[str, Any]]
    best: dict[str, dict[str, Any]]
