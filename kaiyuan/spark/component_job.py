"""What every component job (ingest, dedup, score) does around its own transform.

A job writes one component per source into its stage directory (`<run>/<stage>/<name>/`,
ARCHITECTURE.md contract 2). Around the transform, each of them:
1. skips a source whose component is complete for the same config section and inputs
   (`purokit.manifest.find_complete`: the config hash and the input fingerprints must both match);
2. removes temporary directories a killed run left in the stage (`purokit.atomic.clean_stale_tmp`);
3. writes into a fresh attempt (`components_io.new_tmp_dir`: `.tmp-<name>.<uuid>/` on POSIX,
   `_attempt-<id>/` on an object store) that no reader sees;
4. finalizes: the manifest (config, inputs, counts, timings, side outputs, where the documents came
   from, the lineage of earlier stages) and the commit (rename, or commit record), after which the
   component is complete; an attempt that fails is removed.

`ComponentJob` owns those steps; the jobs supply the transform (`kaiyuan.spark.ingest`,
`kaiyuan.spark.dedup`, `kaiyuan.spark.score`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from purokit import atomic
from purokit import storage
from purokit.component import Component, ComponentManifest
from purokit.log import get_logger
from purokit.manifest import InputFingerprint, find_complete
from kaiyuan.config import SourceConfig
from kaiyuan.spark import components_io as cio


def lineage_entry(c: Component) -> dict[str, Any]:
    """The lineage record of a component a later stage reads."""
    m = c.manifest
    return {"job": m.job, "config_hash": m.config_hash, "code_version": m.code_version,
            "manifest": storage.join(c.directory, "manifest.json"), "n_docs": m.n_docs}


def origin_fields(origin: Component | SourceConfig) -> dict[str, Any]:
    """Where a component's documents come from: the raw source's licence and identity (ingest), or
    the earlier component's, with its lineage extended by that component (dedup, score)."""
    if isinstance(origin, SourceConfig):
        return {"license": origin.license, "source_identifier": origin.source_identifier,
                "source_revision": origin.source_revision}
    m = origin.manifest
    return {"license": m.license, "source_identifier": m.source_identifier, "source_revision": m.source_revision,
            "lineage": m.lineage + [lineage_entry(origin)]}


@dataclass(frozen=True)
class ComponentJob:
    """One job's component bookkeeping in one stage directory (`cfg.stage_dir(...)`)."""

    job: str            # "kaiyuan.dedup": the manifests' `job`
    stage: Path

    @property
    def verb(self) -> str:
        return self.job.rsplit(".", 1)[-1]

    def complete(self, name: str, config: dict[str, Any], inputs: list[InputFingerprint]) -> Optional[ComponentManifest]:
        """The finished component `name` for this config and these inputs, or None (then it is built)."""
        found = find_complete(self.stage / name, ComponentManifest, config, inputs)
        if found is not None:
            docs_in = found.counts.get("docs_in")
            shown = f"{docs_in} -> {found.n_docs}" if docs_in is not None else f"{found.n_docs}"
            get_logger(self.job).info("%s %s: complete (%s docs), skipped", self.verb, name, shown)
        return found

    def clean_stale(self) -> None:
        """Remove the temporary directories of earlier runs that were killed in this stage."""
        atomic.clean_stale_tmp(self.stage)

    def attempt(self, name: str) -> Path:
        """A fresh, invisible directory to write component `name` into."""
        return cio.new_tmp_dir(self.stage / name)

    def commit(self, attempt: Path, name: str, *, config: dict[str, Any], inputs: list[InputFingerprint],
               origin: Component | SourceConfig, counts: dict[str, Any], timings_s: dict[str, float],
               outputs: list[str], expect_docs: Optional[int] = None, **fields: Any) -> ComponentManifest:
        """Write the manifest and commit the attempt as component `name` (the attempt is removed when
        that fails); `expect_docs`: the documents the transform counted, checked against the files."""
        manifest = cio.finalize(attempt, self.stage / name, {
            "schema": ComponentManifest.SCHEMA, "job": self.job, "name": name, "config": config, "inputs": inputs,
            "counts": counts, "timings_s": timings_s, "outputs": outputs, **fields, **origin_fields(origin)})
        if expect_docs is not None and manifest.n_docs != expect_docs:
            raise RuntimeError(f"{self.verb} {name}: wrote {manifest.n_docs} documents, counted {expect_docs}")
        return manifest
