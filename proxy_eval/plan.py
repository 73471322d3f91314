"""`python -m proxy_eval plan`: apply the slice rules to components and write each slice.

Streams `id`, `n_tokens` and the score column of each component once into a spill of per-document
selection records (`proxy_eval.slices.KEY_DTYPE`, 25 bytes a document on disk), locates the slice
bounds in a few passes over it, then streams the component once more to write every slice as a
component of its own (the Component contract, `purokit.component`), so that mixtures can turn it
into a uniform shard set like any other component. Memory is flat in the number of documents.
Output:

    <out>/manifest.json             SlicePlan manifest: decisions, slices, counts, config, inputs
    <out>/slices/<slice name>/      one component per slice (parquet + manifest.json)
    <out>/specs/<slice name>.yaml   (with `spec_base`) the slice as a mixture spec on the original
    <out>/specs/<slice name>.ids    component retaining exactly its documents by id (Spark path)

A rerun with the same config and inputs finds the plan's manifest complete and does nothing.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from pydantic import Field

from purokit import atomic
from purokit.component import Component, finalize_component
from purokit.document import QUALITY_PREFIX, score_columns
from purokit.errors import ContractError
from purokit.hashing import config_hash
from purokit.log import get_logger
from purokit.config import StrictModel
from purokit.manifest import MANIFEST_NAME, RunManifest, Stopwatch, find_complete, fingerprints
from mixtures.spec import ComponentSpec, MixtureSpec, PhaseShare, PhaseSpec, RetainIds
from mixtures.tokenizers import load_tokenizer
from proxy_eval.slices import (ELIGIBLE, KEY_DTYPE, SCORED, ComponentDecision, SliceBounds, SliceRules,
                               component_is_scored, decide_component, doc_hash_keys, in_slice, key_records,
                               slice_bounds)

log = get_logger(__name__)


class ComponentRef(StrictModel):
    """A component to consider for proxy slices."""

    path: str
    name: str | None = None                   # default: the component manifest's name
    # `quality.<name>` (or just `<name>`); "auto" = the component's only quality column; None = unscored
    score_field: str | None = "auto"
    higher_is_better: bool = True


class PlanConfig(StrictModel):
    components: list[ComponentRef]
    rules: SliceRules = Field(default_factory=SliceRules)
    out: str = "runs/proxy/plan"
    write_slices: bool = True
    rows_per_file: int = 50_000
    verify_hashes: bool = False
    # components without an `n_tokens` column are counted with this tokenizer (a mixtures
    # `tokenizer:` block or a tokenizer.json path); slices written from them get the column
    count_tokens_with: dict[str, Any] | str | None = None
    # documents (by id) that no slice may contain, e.g. the evaluation sets (decontamination):
    # a text file with one id per line, or a parquet/jsonl file with an `id` column
    exclude_ids: str | None = None
    # when given (at least `tokenizer` and `seq_len` of a mixture spec), each slice is also written as
    # a one-component `mixture/1` spec on the *original* component retaining exactly the slice's
    # documents by id (`specs/<slice>.ids`), for slices too large to shard in this process:
    # materialize those with the Spark job (`spark-submit kaiyuan/jobs/materialize.py --spec ...`)
    spec_base: dict[str, Any] | None = None


class PlannedSlice(StrictModel):
    name: str
    component: str
    kind: Literal["quantile", "random"]
    percentile: float | None = None
    percentile_from: str | None = None
    band: tuple[float, float] | None = None
    target_tokens: int
    n_docs: int
    n_tokens: int
    score_field: str | None = None
    score_range: tuple[float, float] | None = None
    path: str | None = None                   # the slice component directory, relative to the plan dir
    spec: str | None = None                   # the slice as a mixture spec on the original component


class SlicePlan(RunManifest):
    SCHEMA = "proxy_eval.slice_plan/1"
    decisions: list[ComponentDecision]
    slices: list[PlannedSlice]

    @classmethod
    def load(cls, plan_dir: str | Path) -> "SlicePlan":
        return cls.read(Path(plan_dir) / MANIFEST_NAME)

    def slice_dir(self, plan_dir: str | Path, name: str) -> Path:
        for s in self.slices:
            if s.name == name:
                if s.path is None:
                    raise ContractError(Path(plan_dir) / MANIFEST_NAME, f"slice {name} was planned but not written "
                                        "(write_slices: false)", field="slices")
                return Path(plan_dir) / s.path
        raise ContractError(Path(plan_dir) / MANIFEST_NAME, f"no slice named {name!r}", field="slices")


def resolve_score_field(component: Component, ref: ComponentRef) -> str | None:
    if ref.score_field is None:
        return None
    cols = score_columns(component.columns)
    if ref.score_field == "auto":
        if len(cols) > 1:
            raise ContractError(component.directory / MANIFEST_NAME, f"has several score columns ({', '.join(cols)}); "
                                "name the one to slice by (score_field) or null for an unscored plan",
                                field="score_field")
        return cols[0] if cols else None
    field = ref.score_field if ref.score_field.startswith(QUALITY_PREFIX) else QUALITY_PREFIX + ref.score_field
    component.require_column(field, "the slice plan's score field")
    return field


def read_id_list(path: str | Path) -> set[str]:
    p = Path(path)
    if p.suffix == ".parquet":
        return set(str(x) for x in pq.read_table(p, columns=["id"]).column("id").to_pylist())
    if p.suffix in (".jsonl", ".json"):
        return {str(json.loads(line)["id"]) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}
    return {line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}


class KeySpill:
    """The selection records (`slices.KEY_DTYPE`) of one component, written once while streaming
    its files and read back chunk by chunk for every pass: 25 bytes per document on disk, memory
    flat in the number of documents."""

    CHUNK = 1 << 20

    def __init__(self, path: Path):
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.n_docs = 0

    def append(self, rec: np.ndarray) -> None:
        with open(self.path, "ab") as fh:
            rec.tofile(fh)
        self.n_docs += len(rec)

    def chunks(self, size: int | None = None) -> Iterator[np.ndarray]:
        size = size or self.CHUNK
        with open(self.path, "rb") as fh:
            while True:
                rec = np.fromfile(fh, dtype=KEY_DTYPE, count=size)
                if not len(rec):
                    return
                yield rec

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def spill_component(component: Component, score_field: str | None, ref: ComponentRef, rules: SliceRules,
                    excluded: set[str], tokenizer: Any, spill: KeySpill, batch_size: int = 65_536) -> dict[str, int]:
    """Stream `id`, `n_tokens` (or the text, counted here) and the score column once, writing
    every document's selection record; returns counts (documents, excluded, unscored, tokens)."""
    counted = "n_tokens" not in component.columns
    if counted and tokenizer is None:
        component.require_column("n_tokens", "slice sizes are in tokens; count tokens first (kaiyuan) or set "
                                 "count_tokens_with")
    cols = ["id", "text" if counted else "n_tokens"] + ([score_field] if score_field else [])
    counts = {"docs": 0, "excluded": 0, "unscored": 0, "tokens": 0, "scored_tokens": 0}
    for batch in component.iter_batches(columns=cols, batch_size=batch_size):
        ids = [str(x) for x in batch.column("id").to_pylist()]
        if counted:
            texts = [t or "" for t in batch.column("text").to_pylist()]
            n_tokens = np.fromiter((len(x) for x in tokenizer.encode_batch(texts)), dtype=np.int64, count=len(texts))
        else:
            n_tokens = batch.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        scores = None
        if score_field:
            scores = pc.cast(batch.column(score_field), pa.float64()).to_numpy(zero_copy_only=False)
        eligible = np.fromiter((i not in excluded for i in ids), dtype=bool, count=len(ids)) if excluded else None
        rec = key_records(ids, n_tokens, scores, rules.seed, ref.name or component.name, ref.higher_is_better,
                          rules.percentile_from, eligible)
        spill.append(rec)
        ok = (rec["flags"] & ELIGIBLE) > 0
        has = (rec["flags"] & SCORED) > 0
        counts["docs"] += len(rec)
        counts["excluded"] += int((~ok).sum())
        counts["unscored"] += int((ok & ~has).sum()) if score_field else 0
        counts["tokens"] += int(rec["mass"][ok].sum())
        counts["scored_tokens"] += int(rec["mass"][ok & has].sum())
    counts["counted"] = int(counted)
    return counts


class SliceWriter:
    """Rows of a component written as a new component (parquet parts, then `finalize_component`)."""

    def __init__(self, component: Component, final_dir: Path, slice_name: str, extra: dict, rows_per_file: int):
        self.component, self.final_dir, self.name, self.extra = component, final_dir, slice_name, extra
        self.rows_per_file = rows_per_file
        self.tmp = final_dir.with_name(f"{atomic.TMP_PREFIX}{final_dir.name}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.writer: pq.ParquetWriter | None = None
        self.part = self.in_part = self.n_docs = self.n_tokens = 0

    def write(self, kept: pa.RecordBatch) -> None:
        if not kept.num_rows:
            return
        if self.writer is None or self.in_part >= self.rows_per_file:
            if self.writer is not None:
                self.writer.close()
            self.writer = pq.ParquetWriter(self.tmp / f"part-{self.part:05d}.parquet", kept.schema)
            self.part, self.in_part = self.part + 1, 0
        self.writer.write_batch(kept)
        self.in_part += kept.num_rows
        self.n_docs += kept.num_rows
        self.n_tokens += int(pc.sum(kept.column("n_tokens")).as_py() or 0)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        m = self.component.manifest
        finalize_component(self.tmp, self.final_dir, {
            "job": "proxy_eval.slice", "name": self.name, "n_tokens": self.n_tokens,
            "tokenizer": m.tokenizer, "license": m.license, "source_identifier": m.source_identifier,
            "source_revision": m.source_revision, "config": self.extra,
            "counts": {"n_docs": self.n_docs, "n_tokens": self.n_tokens},
            "lineage": [*m.lineage, {"job": m.job, "config_hash": m.config_hash, "code_version": m.code_version,
                                     "manifest": str(self.component.directory / MANIFEST_NAME)}],
        })


def write_slices(component: Component, spill: KeySpill, bounds: list[SliceBounds], score_field: str | None,
                 writers: dict[str, SliceWriter], id_files: dict[str, Path], batch_size: int = 65_536
                 ) -> dict[str, dict[str, Any]]:
    """One streaming pass over the component: every slice's documents go to its writer (when
    writing slices) and its ids to its id file (when writing specs). Returns per slice its
    documents, tokens and score range."""
    counted = "n_tokens" not in component.columns
    stats = {b.spec.name: {"n_docs": 0, "n_tokens": 0, "lo": math.inf, "hi": -math.inf} for b in bounds}
    id_fhs = {name: open(path, "w", encoding="utf-8") for name, path in id_files.items()}
    records = spill.chunks(batch_size)
    buffer = np.zeros(0, dtype=KEY_DTYPE)
    row0 = 0
    try:
        for batch in component.iter_batches(batch_size=batch_size):
            while len(buffer) < batch.num_rows:
                buffer = np.concatenate([buffer, next(records)])
            rec, buffer = buffer[:batch.num_rows], buffer[batch.num_rows:]
            if counted:
                batch = batch.append_column(pa.field("n_tokens", pa.int64()), pa.array(rec["mass"]))
            for b in bounds:
                mask = in_slice(rec, row0, b)
                if not mask.any():
                    continue
                st = stats[b.spec.name]
                st["n_docs"] += int(mask.sum())
                st["n_tokens"] += int(rec["mass"][mask].sum())
                if b.use_key and score_field:
                    sc = pc.cast(batch.column(score_field), pa.float64()).to_numpy(zero_copy_only=False)[mask]
                    st["lo"], st["hi"] = min(st["lo"], float(sc.min())), max(st["hi"], float(sc.max()))
                kept = batch.filter(pa.array(mask))
                if b.spec.name in writers:
                    writers[b.spec.name].write(kept)
                if b.spec.name in id_fhs:
                    id_fhs[b.spec.name].write("".join(f"{i}\n" for i in kept.column("id").to_pylist()))
            row0 += batch.num_rows
    finally:
        for fh in id_fhs.values():
            fh.close()
    for w in writers.values():
        w.close()
    return stats


def write_component_rows(component: Component, rows: np.ndarray, final_dir: Path, slice_name: str,
                         extra: dict, rows_per_file: int, counted_tokens: np.ndarray | None = None) -> None:
    """Write the selected rows (global row numbers) of a component as a new component, streaming it
    once in file order. `counted_tokens`: per-row token counts to add as the `n_tokens` column (when
    the component had none)."""
    selected = np.zeros(component.manifest.n_docs, dtype=bool)
    selected[rows] = True
    writer = SliceWriter(component, final_dir, slice_name, extra, rows_per_file)
    offset = 0
    for batch in component.iter_batches():
        mask = selected[offset:offset + batch.num_rows]
        if mask.any():
            kept = batch.filter(pa.array(mask))
            if counted_tokens is not None:
                kept = kept.append_column(pa.field("n_tokens", pa.int64()),
                                          pa.array(counted_tokens[offset:offset + batch.num_rows][mask]))
            writer.write(kept)
        offset += batch.num_rows
    writer.close()


def slice_mixture_spec(s: "PlannedSlice", component_path: str, ids_file: str, base: dict[str, Any]) -> MixtureSpec:
    """A one-component `mixture/1` spec of exactly the slice's documents, by id, on the original
    component: the plan's selection (streaming, flat memory) is the one selection, and the Spark
    materialization only tokenizes and shards what it chose."""
    return MixtureSpec(
        name=f"proxy-slice-{s.name}", **base,
        components=[ComponentSpec(name=s.component, path=component_path, order_seed=0,
                                  retention=RetainIds(rule="ids", ids_file=ids_file))],
        phases=[PhaseSpec(name="slice", orders=["uniform"], components={s.component: PhaseShare()})])


def planned_slice(b: SliceBounds, st: dict[str, Any], component_name: str, component_path: str, config: PlanConfig,
                  out: Path, ids_file: Path | None) -> PlannedSlice:
    """A written slice as the plan lists it (`st`: what `write_slices` counted for it); with
    `config.spec_base`, its one-component mixture spec is written under `out/specs/` too."""
    s = b.spec
    ps = PlannedSlice(
        name=s.name, component=component_name, kind=s.kind, percentile=s.percentile, percentile_from=s.percentile_from,
        band=s.band, target_tokens=s.target_tokens, n_docs=st["n_docs"], n_tokens=st["n_tokens"],
        score_field=s.score_field if s.kind == "quantile" else None,
        score_range=(st["lo"], st["hi"]) if s.kind == "quantile" and st["n_docs"] else None,
        path=f"slices/{s.name}" if config.write_slices else None,
    )
    if config.spec_base is not None:
        ps.spec = f"specs/{s.name}.yaml"
        spec = slice_mixture_spec(ps, str(Path(component_path).resolve()), str(ids_file.resolve()), config.spec_base)
        header = (f"# slice {s.name} of component {component_name} as a mixture spec on the original component "
                  f"(written by `python -m proxy_eval plan`):\n# exactly the documents of slices/{s.name}/, "
                  f"listed by id in {ids_file.name}.\n")
        atomic.write_text(out / ps.spec, header + yaml.safe_dump(spec.to_yaml_dict(), sort_keys=False))
    return ps


def make_plan(config: PlanConfig) -> SlicePlan:
    """Decide and (optionally) write every slice; skip when a complete plan exists. Each
    component is streamed: once to spill its selection records, a few passes over those to
    locate the slice bounds, once more to write the slices."""
    out = Path(config.out)
    inputs = fingerprints([Path(c.path) / "manifest.json" for c in config.components]
                          + ([config.exclude_ids] if config.exclude_ids else []))
    done = find_complete(out, SlicePlan, config, inputs)
    if done is None and (out / MANIFEST_NAME).exists():
        log.info("plan in %s is for another config or inputs: replanning", out)
    if done is not None:
        log.info("slice plan in %s is complete for this config: reusing it", out)
        return done
    sw = Stopwatch()
    excluded = read_id_list(config.exclude_ids) if config.exclude_ids else set()
    tokenizer = load_tokenizer(config.count_tokens_with) if config.count_tokens_with is not None else None
    decisions: list[ComponentDecision] = []
    planned: list[PlannedSlice] = []
    counts = {"components": 0, "slices": 0, "skipped_components": 0, "unscored_docs": 0, "excluded_docs": 0,
              "counted_components": 0}
    out.mkdir(parents=True, exist_ok=True)
    slices_root = out / "slices"
    shutil.rmtree(slices_root, ignore_errors=True)   # slices of an older plan are not this plan's
    shutil.rmtree(out / "specs", ignore_errors=True)
    spill_path = out / f"{atomic.TMP_PREFIX}keys.bin"
    for ref in config.components:
        component = Component.open(ref.path, verify_hashes=config.verify_hashes)
        name = ref.name or component.name
        with sw(f"select.{name}"):
            field = resolve_score_field(component, ref)
            spill = KeySpill(spill_path)
            c = spill_component(component, field, ref, config.rules, excluded, tokenizer, spill)
            counts["counted_components"] += c["counted"]
            counts["excluded_docs"] += c["excluded"]
            counts["unscored_docs"] += c["unscored"]
            scored = field is not None and component_is_scored(c["scored_tokens"], c["tokens"], config.rules)
            decision = decide_component(name, c["tokens"], scored, config.rules, score_field=field,
                                        higher_is_better=ref.higher_is_better)
            bounds = slice_bounds(decision, spill.chunks) if decision.slices else []
        decisions.append(decision)
        counts["components"] += 1
        counts["skipped_components"] += decision.rule == "skip"
        log.info("%s: %s (%s), %d slice(s)", name, decision.rule, decision.reason, len(bounds))
        if not bounds:
            continue
        extra = {"rules": config.rules.model_dump(mode="json")}
        writers = {b.spec.name: SliceWriter(component, out / f"slices/{b.spec.name}", b.spec.name,
                                            {"slice": b.spec.model_dump(mode="json"), **extra}, config.rows_per_file)
                   for b in bounds} if config.write_slices else {}
        id_files = {b.spec.name: out / f"specs/{b.spec.name}.ids" for b in bounds} if config.spec_base else {}
        for f in id_files.values():
            f.parent.mkdir(parents=True, exist_ok=True)
        with sw(f"write.{name}"):
            stats = write_slices(component, spill, bounds, field, writers, id_files)
        for b in bounds:
            planned.append(planned_slice(b, stats[b.spec.name], name, ref.path, config, out, id_files.get(b.spec.name)))
            counts["slices"] += 1
    KeySpill(spill_path).remove()
    if not config.write_slices and slices_root.exists():
        shutil.rmtree(slices_root)
    plan = SlicePlan(job="proxy_eval.plan", config=config.model_dump(mode="json"), config_hash=config_hash(config),
                     inputs=inputs, counts=counts, timings_s=sw.timings_s, decisions=decisions, slices=planned,
                     outputs=[p.path for p in planned if p.path])
    # the manifest is written last: its presence means every slice directory is complete
    plan.write(out)
    return plan


def sample_component(component: Component, budget_tokens: int, out_dir: Path, seed: int, exclude: set[str],
                     tokenizer: Any = None, name: str | None = None) -> Path:
    """A seeded random sample of about `budget_tokens` tokens of a component (documents in a
    seeded hash order, skipping `exclude`, until the budget is reached), written as a component.
    Tokens are counted only for the documents looked at when the component has no `n_tokens`."""
    ids = [str(x) for x in component.read(columns=["id"]).column("id").to_pylist()]
    keys = doc_hash_keys(ids, seed, salt=f"sample:{component.name}")
    order = [int(i) for i in np.argsort(keys, kind="stable") if ids[int(i)] not in exclude]
    counted = "n_tokens" not in component.columns
    if counted and tokenizer is None:
        component.require_column("n_tokens", "sampling by tokens needs counts or a tokenizer")
    tokens = np.zeros(len(ids), dtype=np.int64)
    if not counted:
        tokens[:] = component.read(columns=["n_tokens"]).column("n_tokens").fill_null(0).to_numpy(
            zero_copy_only=False)
        texts = None
    else:
        texts = component.read(columns=["text"]).column("text").to_pylist()
    chosen: list[int] = []
    total = 0
    step = 256
    for start in range(0, len(order), step):
        chunk = order[start:start + step]
        if counted:
            for i, t in zip(chunk, tokenizer.encode_batch([texts[i] or "" for i in chunk])):
                tokens[i] = len(t)
        for i in chunk:
            if total >= budget_tokens:
                break
            chosen.append(i)
            total += int(tokens[i])
        if total >= budget_tokens:
            break
    write_component_rows(component, np.array(sorted(chosen), dtype=np.int64), out_dir, name or component.name,
                         {"sample_of": str(component.directory), "budget_tokens": budget_tokens, "seed": seed},
                         50_000, tokens if counted else None)
    return out_dir
