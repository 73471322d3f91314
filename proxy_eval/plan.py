"""`python -m proxy_eval plan`: apply the slice rules to components and write each slice.

Reads only `id`, `n_tokens` and the score column of each component to decide and pick documents
(`proxy_eval.slices`), then streams the component once more to write every slice as a component
of its own (the Component contract, `common.component`), so that mixtures can turn it into a
uniform shard set like any other component. Output:

    <out>/manifest.json             SlicePlan manifest: decisions, slices, counts, config, inputs
    <out>/slices/<slice name>/      one component per slice (parquet + manifest.json)
    <out>/specs/<slice name>.yaml   (with `spec_base`) the slice as a mixture spec on the original
                                    component, for the Spark materialization of large pools

A rerun with the same config and inputs finds the plan's manifest complete and does nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from common import atomic
from common.component import Component, finalize_component
from common.document import QUALITY_PREFIX, score_columns
from common.errors import ContractError
from common.hashing import config_hash
from common.log import get_logger
from common.manifest import MANIFEST_NAME, RunManifest, Stopwatch, find_complete, fingerprints
from proxy_eval.slices import ComponentDecision, SliceRules, component_is_scored, decide_component, select_slices

log = get_logger(__name__)



class ComponentRef(BaseModel):
    """A component to consider for proxy slices."""

    model_config = ConfigDict(extra="forbid")
    path: str
    name: str | None = None                   # default: the component manifest's name
    # `quality.<name>` (or just `<name>`); "auto" = the component's only quality column; None = unscored
    score_field: str | None = "auto"
    higher_is_better: bool = True


class PlanConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
    # a one-component `mixture/1` spec on the *original* component (quantile_band / random_tokens
    # retention), for pools too large for this process: materialize those with the Spark job
    # (`spark-submit kaiyuan/jobs/materialize.py --spec <out>/specs/<slice>.yaml`)
    spec_base: dict[str, Any] | None = None


class PlannedSlice(BaseModel):
    model_config = ConfigDict(extra="forbid")
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
        import json

        return {str(json.loads(line)["id"]) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}
    return {line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}


def count_tokens(component: Component, tokenizer: Any, batch_size: int = 1024) -> np.ndarray:
    """Tokens per document (no EOS), streamed in file order."""
    out = []
    for batch in component.iter_batches(columns=["text"], batch_size=batch_size):
        texts = [t or "" for t in batch.column("text").to_pylist()]
        out.append(np.fromiter((len(x) for x in tokenizer.encode_batch(texts)), dtype=np.int64, count=len(texts)))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _component_arrays(component: Component, score_field: str | None, tokenizer: Any = None
                      ) -> tuple[list[str], np.ndarray, np.ndarray | None, bool]:
    """ids, tokens per document, scores (NaN = none) and whether the tokens were counted here."""
    counted = "n_tokens" not in component.columns
    if counted and tokenizer is None:
        component.require_column("n_tokens", "slice sizes are in tokens; count tokens first (kaiyuan) or set "
                                 "count_tokens_with")
    cols = ["id"] + ([] if counted else ["n_tokens"]) + ([score_field] if score_field else [])
    table = component.read(columns=cols)
    ids = table.column("id").to_pylist()
    if counted:
        n_tokens = count_tokens(component, tokenizer)
    else:
        n_tokens = table.column("n_tokens").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    scores = None
    if score_field:
        scores = pc.cast(table.column(score_field), pa.float64()).to_numpy(zero_copy_only=False)
        scores = np.where(np.isfinite(scores), scores, np.nan)
    return ids, n_tokens, scores, counted


def write_component_rows(component: Component, rows: np.ndarray, final_dir: Path, slice_name: str,
                           extra: dict, rows_per_file: int, counted_tokens: np.ndarray | None = None) -> None:
    """Write the selected rows (global row numbers) of a component as a new component, streaming it
    once in file order. `counted_tokens`: per-row token counts to add as the `n_tokens` column (when
    the component had none)."""
    selected = np.zeros(component.manifest.n_docs, dtype=bool)
    selected[rows] = True
    tmp = final_dir.with_name(f"{atomic.TMP_PREFIX}{final_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writer: pq.ParquetWriter | None = None
    part, in_part, offset = 0, 0, 0
    n_tokens_total = 0
    try:
        for batch in component.iter_batches():
            mask = selected[offset:offset + batch.num_rows]
            offset += batch.num_rows
            if not mask.any():
                continue
            kept = batch.filter(pa.array(mask))
            if counted_tokens is not None:
                kept = kept.append_column(pa.field("n_tokens", pa.int64()),
                                          pa.array(counted_tokens[offset - batch.num_rows:offset][mask]))
            n_tokens_total += int(pc.sum(kept.column("n_tokens")).as_py() or 0)
            if writer is None or in_part >= rows_per_file:
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(tmp / f"part-{part:05d}.parquet", kept.schema)
                part, in_part = part + 1, 0
            writer.write_batch(kept)
            in_part += kept.num_rows
    finally:
        if writer is not None:
            writer.close()
    m = component.manifest
    finalize_component(tmp, final_dir, {
        "job": "proxy_eval.slice", "name": slice_name, "n_tokens": n_tokens_total,
        "tokenizer": m.tokenizer, "license": m.license, "source_identifier": m.source_identifier,
        "source_revision": m.source_revision, "config": extra,
        "counts": {"n_docs": int(selected.sum()), "n_tokens": n_tokens_total},
        "lineage": [*m.lineage, {"job": m.job, "config_hash": m.config_hash, "code_version": m.code_version,
                                 "manifest": str(component.directory / MANIFEST_NAME)}],
    })


def slice_mixture_spec(s: "PlannedSlice", component_path: str, base: dict[str, Any]) -> dict[str, Any]:
    """A one-component `mixture/1` spec selecting the slice from the original component. Mixtures'
    rank runs from the least preferred end (rank 0) to the best (rank 1), so a band [lo, hi) from
    the best end is the rank band [1 - hi, 1 - lo)."""
    comp: dict[str, Any] = {"name": s.component, "path": component_path, "order_seed": 0}
    if s.kind == "quantile":
        assert s.band is not None
        lo, hi = s.band
        if s.percentile_from == "worst":
            low, high = lo, hi
        else:
            low, high = 1.0 - hi, 1.0 - lo
        comp.update(score_field=s.score_field, retention={"rule": "quantile_band", "low": max(0.0, round(low, 12)),
                                                           "high": min(1.0, round(high, 12))})
    else:
        comp["retention"] = {"rule": "random_tokens", "n_tokens": s.target_tokens, "seed": 0}
    return {"schema": "mixture/1", "name": f"proxy-slice-{s.name}", **base, "components": [comp],
            "phases": [{"name": "slice", "orders": ["uniform"], "components": {s.component: {}}}]}


def make_plan(config: PlanConfig) -> SlicePlan:
    """Decide and (optionally) write every slice; skip when a complete plan exists."""
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
    tokenizer = None
    if config.count_tokens_with is not None:
        from mixtures.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(config.count_tokens_with)
    decisions: list[ComponentDecision] = []
    planned: list[PlannedSlice] = []
    counts = {"components": 0, "slices": 0, "skipped_components": 0, "unscored_docs": 0, "excluded_docs": 0,
              "counted_components": 0}
    out.mkdir(parents=True, exist_ok=True)
    slices_root = out / "slices"
    shutil.rmtree(slices_root, ignore_errors=True)   # slices of an older plan are not this plan's
    shutil.rmtree(out / "specs", ignore_errors=True)
    for ref in config.components:
        component = Component.open(ref.path, verify_hashes=config.verify_hashes)
        name = ref.name or component.name
        with sw(f"select.{name}"):
            field = resolve_score_field(component, ref)
            all_ids, all_tokens, all_scores, counted = _component_arrays(component, field, tokenizer)
            counts["counted_components"] += counted
            # excluded documents (eval sets) take no part in deciding or selecting
            keep_rows = np.flatnonzero([i not in excluded for i in all_ids]) if excluded else np.arange(len(all_ids))
            counts["excluded_docs"] += len(all_ids) - len(keep_rows)
            ids = [all_ids[i] for i in keep_rows]
            n_tokens = all_tokens[keep_rows]
            scores = all_scores[keep_rows] if all_scores is not None else None
            total = int(n_tokens.sum())
            scored = False
            if scores is not None:
                has = ~np.isnan(scores)
                counts["unscored_docs"] += int((~has).sum())
                scored = component_is_scored(int(n_tokens[has].sum()), total, config.rules)
            decision = decide_component(name, total, scored, config.rules, score_field=field,
                                        higher_is_better=ref.higher_is_better)
            selections = select_slices(decision, ids, n_tokens, scores if scored else None)
        decisions.append(decision)
        counts["components"] += 1
        counts["skipped_components"] += decision.rule == "skip"
        log.info("%s: %s (%s), %d slice(s)", name, decision.rule, decision.reason, len(selections))
        for sel in selections:
            s = sel.spec
            rel = None
            if config.write_slices:
                rel = f"slices/{s.name}"
                with sw(f"write.{s.name}"):
                    write_component_rows(component, keep_rows[sel.rows], out / rel, s.name,
                                           {"slice": s.model_dump(mode="json"), "rules": config.rules.model_dump(mode="json")},
                                           config.rows_per_file, all_tokens if counted else None)
            ps = PlannedSlice(
                name=s.name, component=name, kind=s.kind, percentile=s.percentile, percentile_from=s.percentile_from,
                band=s.band, target_tokens=s.target_tokens, n_docs=len(sel.rows), n_tokens=sel.n_tokens,
                score_field=s.score_field if s.kind == "quantile" else None, score_range=sel.score_range, path=rel,
            )
            if config.spec_base is not None:
                import yaml

                ps.spec = f"specs/{s.name}.yaml"
                header = (f"# slice {s.name} of component {name} as a mixture spec on the original component "
                          "(written by `python -m proxy_eval plan`).\n# Unlike slices/<name>/, it does not "
                          "leave out exclude_ids, and band edges fall on token mass rather than documents.\n")
                atomic.write_text(out / ps.spec, header + yaml.safe_dump(
                    slice_mixture_spec(ps, str(Path(ref.path).resolve()), config.spec_base), sort_keys=False))
            planned.append(ps)
            counts["slices"] += 1
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
    from proxy_eval.slices import doc_hash_keys

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
