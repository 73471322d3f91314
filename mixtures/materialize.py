"""Local materialization: `python -m mixtures materialize --spec mixture.yaml --out shards/`.

Three passes, streaming, memory bounded by per-document metadata (never by text or tokens):

1. tokenize   each component once, batch by batch (pyarrow), into a token spill in the work
              directory (`<out>/.work-<spec hash>/<component>/`): tokens in the shard dtype plus
              a docs.parquet of (id, n_tokens, score, dup_count). Empty documents are quarantined
              with a reason and counted. A finished component is reused after a kill.
2. plan       the pure planning of `mixtures.plan` on the per-document columns.
3. write      every shard set (one per phase and order, plus `eval`), file by file, gathering
              tokens from the spill; each set is renamed into place only when complete, with its
              manifest (content, byte-identical for equal inputs) and run.json (timings, engine).

The Spark engine (`kaiyuan/spark/materialize.py`) runs the same plan on DataFrames, selects sets
with the same `select_sets` and writes with the same `write_shard_file`, so both engines give
byte-identical shards.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from purokit import atomic
from purokit import storage
from purokit.component import Component
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.log import get_logger
from purokit.progress import progress_text
from purokit.manifest import MANIFEST_NAME, RunManifest, find_complete, fingerprints
from mixtures.plan import (ComponentColumns, Pool, StreamPlan, bucket_stats, holdout_masks, plan_eval,
                           plan_phase_pool, plan_stream, retention_mask)
from mixtures.shards import (RUN_RECORD_NAME, ComponentUse, CompositionStats, ShardFile, ShardFileWriter,
                             ShardManifest, build_manifest, token_dtype)
from mixtures.spec import MixtureSpec, MixtureSpecError, check_components, load_spec
from mixtures.tokenizers import Tokenizer, load_tokenizer

log = get_logger("mixtures.materialize")

JOB = "mixtures.materialize"
BATCH_DOCS = 2048
WRITE_CHUNK_TOKENS = 1 << 22
QUARANTINE_REASONS = ("null_text", "empty_text")


# ---- shared by both engines ---------------------------------------------------------------------

def write_shard_file(directory: Path, name: str, segment: str, docs: Iterable[tuple[np.ndarray, str, str, int, float, int]],
                     vocab_size: int) -> ShardFile:
    """Write one shard from (tokens incl. EOS, doc_id, component label, bucket, rank, copy) in
    stream order. Chunking is fixed here, so every engine produces the same bytes and sums."""
    w = ShardFileWriter(directory, name, token_dtype(vocab_size), segment=segment, vocab_size=vocab_size)
    try:
        buf: list[tuple[np.ndarray, str, str, int, float, int]] = []
        n_buf = 0
        for d in docs:
            buf.append(d)
            n_buf += int(d[0].size)
            if n_buf >= WRITE_CHUNK_TOKENS:
                _flush(w, buf)
                buf, n_buf = [], 0
        if buf:
            _flush(w, buf)
        return w.close()
    except BaseException:
        w.abort()
        raise


def _flush(w: ShardFileWriter, buf: list) -> None:
    w.add_many(np.concatenate([b[0] for b in buf]), np.array([b[0].size for b in buf], dtype=np.int64),
               [b[1] for b in buf], [b[2] for b in buf], np.array([b[3] for b in buf], dtype=np.int64),
               np.array([b[4] for b in buf], dtype=np.float64), np.array([b[5] for b in buf], dtype=np.int64))


def set_names(spec: MixtureSpec) -> list[tuple[str, str | None, str]]:
    """(set name, phase, order) of every shard set a spec produces, in writing order."""
    out: list[tuple[str, str | None, str]] = []
    for p in spec.phases:
        for o in p.orders:
            out.append((f"{p.name}-{o}", p.name, o))
    if spec.holdout is not None:
        out.append(("eval", None, "eval"))
    return out


def select_sets(spec: MixtureSpec, set_dir: Callable[[str], Path], inputs: list, *, sets: list[str] | None = None,
                force: bool = False, progress: Callable[[str], None] = print
                ) -> tuple[dict[str, ShardManifest], list[tuple[str, str | None, str]]]:
    """Which of the spec's sets (all, or the named `sets`) to write, in writing order, and which are
    complete from an earlier run with the same spec and inputs (reused unless `force`). Both
    engines call this. Returns ({set name: reused manifest}, [(set name, phase, order) to write])."""
    every = set_names(spec)
    unknown = set(sets or ()) - {s[0] for s in every}
    if unknown:
        raise MixtureSpecError("<sets>", f"unknown set(s) {sorted(unknown)}; this spec makes {[s[0] for s in every]}")
    reused: dict[str, ShardManifest] = {}
    todo = []
    for name, phase, order in every:
        if sets and name not in sets:
            continue
        found = None if force else find_complete(set_dir(name), ShardManifest, set_config(spec, name, phase, order), inputs)
        if found is not None and found.spec_hash == spec.spec_hash():
            reused[name] = found
            progress(f"{name}: complete from an earlier run (same spec and inputs), reused")
        else:
            todo.append((name, phase, order))
    return reused, todo


def seeds_of(spec: MixtureSpec, phase_names: list[str]) -> dict[str, int]:
    seeds = {f"seeds.{k}": v for k, v in spec.seeds.model_dump().items()}
    for c in spec.components:
        seeds[f"order_seed.{c.name}"] = c.order_seed
        if c.retention.rule == "random_tokens":
            seeds[f"retention_seed.{c.name}"] = c.retention.seed
    return dict(sorted(seeds.items()))


def set_config(spec: MixtureSpec, set_name: str, phase: str | None, order: str) -> dict[str, Any]:
    return {"spec": spec.to_yaml_dict(), "set": set_name, "phase": phase, "order": order}


# ---- 1. tokenize --------------------------------------------------------------------------------

@dataclass
class TokenSpill:
    """One component tokenized: tokens of its valid documents back to back, and their columns."""

    directory: Path
    dtype: np.dtype

    @property
    def done(self) -> Path:
        return self.directory / "done.json"

    def columns(self, name: str, source: str = "") -> ComponentColumns:
        t = pq.read_table(self.directory / "docs.parquet")
        score = t.column("score").to_numpy(zero_copy_only=False).astype(np.float64) if "score" in t.column_names else None
        dup = (t.column("dup_count").fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
               if "dup_count" in t.column_names else None)
        return ComponentColumns(name=name, ids=np.array(t.column("id").to_pylist(), dtype=object),
                                n_tokens=t.column("n_tokens").to_numpy(), scores=score, dup_count=dup, source=source)

    def reader(self, n_tokens: np.ndarray) -> "SpillReader":
        return SpillReader(self.directory / "tokens.bin", n_tokens, self.dtype)


class SpillReader:
    """doc(row) -> its tokens, by positioned reads (a memory map would count every page it touched
    in the process's resident memory; pread leaves them to the page cache)."""

    def __init__(self, path: Path, n_tokens: np.ndarray, dtype: np.dtype):
        self._fd = os.open(path, os.O_RDONLY)
        self._offsets = np.concatenate([[0], np.cumsum(n_tokens)]) * dtype.itemsize
        self._dtype = dtype

    def __call__(self, row: int) -> np.ndarray:
        a, b = int(self._offsets[row]), int(self._offsets[row + 1])
        return np.frombuffer(os.pread(self._fd, b - a, a), dtype=self._dtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def tokenize_component(comp: Component, score_field: str | None, tokenizer: Tokenizer, directory: Path,
                       progress: Callable[[str], None] | None = None) -> tuple[TokenSpill, dict[str, Any]]:
    """Pass 1 for one component; reuses a finished spill of the same component and tokenizer."""
    dtype = token_dtype(tokenizer.vocab_size)
    spill = TokenSpill(directory, dtype)
    comp_sha = sha256_file(comp.directory / MANIFEST_NAME)
    want = {"component_manifest_sha256": comp_sha, "tokenizer": tokenizer.identity.digest, "score_field": score_field}
    if spill.done.is_file():
        recorded = json.loads(spill.done.read_text())
        if all(recorded.get(k) == v for k, v in want.items()):
            return spill, recorded
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    cols = ["id", "text"] + ([score_field] if score_field else [])
    has_dup = "dup_count" in comp.manifest.columns
    if has_dup:
        cols.append("dup_count")
    schema = pa.schema([("id", pa.string()), ("n_tokens", pa.int64())]
                       + ([("score", pa.float64())] if score_field else []) + ([("dup_count", pa.int64())] if has_dup else []))
    quarantine: dict[str, list[str]] = {r: [] for r in QUARANTINE_REASONS}
    seen: set[str] = set()
    n_read = n_docs = n_tokens = 0
    t0 = time.perf_counter()
    with open(directory / "tokens.bin", "wb") as fh, pq.ParquetWriter(directory / "docs.parquet", schema) as pw:
        for batch in comp.iter_batches(columns=cols, batch_size=BATCH_DOCS):
            ids = batch.column("id").to_pylist()
            texts = batch.column("text").to_pylist()
            n_read += len(ids)
            for i in ids:
                if i in seen:
                    raise ContractError(comp.directory, f"document id {i!r} appears twice in component "
                                        f"'{comp.name}' (ids must be unique for a deterministic order)", field="id")
                seen.add(i)
            ok = np.array([t is not None and t != "" for t in texts], dtype=bool)
            for i, t, good in zip(ids, texts, ok):
                if not good:
                    quarantine["null_text" if t is None else "empty_text"].append(i)
            keep = np.flatnonzero(ok)
            if keep.size == 0:
                continue
            flat, lengths = tokenizer.encode_flat([texts[j] for j in keep])
            fh.write(flat.astype(dtype).tobytes())
            data = {"id": pa.array([ids[j] for j in keep], pa.string()), "n_tokens": pa.array(lengths, pa.int64())}
            if score_field:
                data["score"] = batch.column(score_field).take(pa.array(keep)).cast(pa.float64())
            if has_dup:
                data["dup_count"] = batch.column("dup_count").take(pa.array(keep)).cast(pa.int64())
            pw.write_table(pa.table(data, schema=schema))
            n_docs += int(keep.size)
            n_tokens += int(lengths.sum())
    elapsed = time.perf_counter() - t0
    if quarantine and any(quarantine.values()):
        pq.write_table(pa.table({"id": [i for r in QUARANTINE_REASONS for i in quarantine[r]],
                                 "reason": [r for r in QUARANTINE_REASONS for _ in quarantine[r]]}),
                       directory / "quarantine.parquet")
    record = {**want, "n_docs_read": n_read, "n_docs": n_docs, "n_tokens": n_tokens, "tokenize_s": round(elapsed, 3),
              "quarantined": {r: len(v) for r, v in quarantine.items()}}
    atomic.write_json(spill.done, record)
    if progress:
        progress(f"tokenized {comp.name}: {n_docs:,} docs, {n_tokens:,} tokens in {elapsed:.1f}s "
                 f"({n_tokens / max(elapsed, 1e-9):,.0f} tokens/s)")
    return spill, record


# ---- 2 + 3. plan and write ----------------------------------------------------------------------

@dataclass
class Planned:
    """Everything planning produced, kept for the writer and the manifests."""

    comps: dict[str, ComponentColumns]
    retained: dict[str, np.ndarray]
    retention_details: dict[str, dict[str, Any]]
    held: dict[str, np.ndarray]
    pools: dict[str, Pool]


def plan_all(spec: MixtureSpec, comps: dict[str, ComponentColumns], source: object = "<spec>") -> Planned:
    held = holdout_masks(spec, comps)
    retained: dict[str, np.ndarray] = {}
    details: dict[str, dict[str, Any]] = {}
    for c in spec.components:
        retained[c.name], details[c.name] = retention_mask(c, comps[c.name], ~held[c.name])
    pools: dict[str, Pool] = {}
    for i, p in enumerate(spec.phases):
        try:
            pools[p.name] = plan_phase_pool(spec, p, comps, retained)
        except ValueError as e:
            raise MixtureSpecError(source, str(e), field=f"phases[{i}].components") from None
    return Planned(comps, retained, details, held, pools)


def stream_plan(spec: MixtureSpec, planned: Planned, phase: str | None, order: str) -> StreamPlan:
    if phase is None:
        return plan_eval(spec, planned.comps, planned.held)
    idx = [p.name for p in spec.phases].index(phase)
    p = spec.phases[idx]
    prev = spec.phases[idx - 1] if idx > 0 and p.transition_tokens else None
    return plan_stream(spec, p, planned.pools[phase], planned.comps, order,
                       replay_pool=planned.pools[prev.name] if prev else None, replay_phase=prev)


def component_uses(spec: MixtureSpec, planned: Planned, plan: StreamPlan, opened: dict[str, Component],
                   spill_records: dict[str, dict[str, Any]], phase: str | None) -> list[ComponentUse]:
    """The local engine's figures for `component_uses_from`."""
    names = [c.name for c in spec.components]
    used = {}
    for i, n in enumerate(names):
        m = plan.comp == i
        used[n] = (int(m.sum()), int(plan.n_tokens[m].sum()))
    retained = {n: (int(planned.retained[n].sum()), int(planned.comps[n].n_tokens[planned.retained[n]].sum()))
                for n in names}
    held = {n: int(planned.held[n].sum()) for n in names}
    present = {plan.labels[i].removeprefix("replay:") for i in np.unique(plan.label)} if plan.label.size else set()
    details = planned.pools[phase].details if phase is not None else None
    return component_uses_from(spec, phase, paths={n: str(opened[n].directory) for n in names}, records=spill_records,
                               retained=retained, held_out=held, used=used, phase_details=details, present=present)


def component_uses_from(spec: MixtureSpec, phase: str | None, *, paths: dict[str, str],
                        records: dict[str, dict[str, Any]], retained: dict[str, tuple[int, int]],
                        held_out: dict[str, int], used: dict[str, tuple[int, int]],
                        phase_details: dict[str, dict[str, Any]] | None, present: set[str]) -> list[ComponentUse]:
    """The manifest's per-component rows from counts any engine can aggregate."""
    wanted = set(present) | (set(spec.phase(phase).components) if phase is not None else set())
    out = []
    for c in spec.components:
        if c.name not in wanted:
            continue
        rec = records[c.name]
        details = {"score_field": c.score_field, "higher_is_better": c.higher_is_better, "repeat": c.repeat,
                   "order_seed": c.order_seed, "retention": c.retention.model_dump(mode="json"),
                   "quarantined": rec["quarantined"], "n_docs_held_out": held_out[c.name]}
        if phase_details is not None and c.name in phase_details:
            details["phase"] = phase_details[c.name]
        out.append(ComponentUse(
            name=c.name, path=paths[c.name], manifest_sha256=rec["component_manifest_sha256"],
            n_docs_read=rec["n_docs_read"], n_docs_retained=retained[c.name][0], n_tokens_retained=retained[c.name][1],
            n_docs_used=used[c.name][0], n_tokens_used=used[c.name][1], details=details))
    return out


def set_progress(progress: Callable[[str], None] | None, done: int, total: int) -> Callable[[str], None] | None:
    """A set's notes in the one progress form: `set 2/3 | wrote p2-curriculum: ...`."""
    if progress is None:
        return None
    return lambda message: progress(progress_text("set", done, total, message))


def write_set(final_dir: Path, set_name: str, plan: StreamPlan, doc_source: Callable[[int, int], np.ndarray],
              doc_id: Callable[[int, int], str], spec: MixtureSpec, tokenizer: Tokenizer, *, phase: str | None,
              order: str, pool: Pool | None, components: list[ComponentUse], inputs: list,
              progress: Callable[[str], None] | None = None, engine: str = "local") -> ShardManifest:
    """Write one shard set from its stream plan; atomic (the directory appears complete or not at all)."""
    t0 = time.perf_counter()
    final = final_dir
    shards: list[ShardFile] = []
    with atomic.atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        for segment, name, pos in plan.files():
            docs = ((doc_source(int(plan.comp[i]), int(plan.row[i])), doc_id(int(plan.comp[i]), int(plan.row[i])),
                     plan.labels[int(plan.label[i])], int(plan.bucket[i]), float(plan.rank[i]), int(plan.copy[i]))
                    for i in pos)
            shards.append(write_shard_file(tmp, name, segment, docs, tokenizer.vocab_size))
        manifest = assemble_manifest(spec, tokenizer, set_name, phase, order, shards, components, inputs, plan.extra,
                                     bucket_count=pool.bucket_count if pool is not None else None,
                                     buckets=bucket_stats(spec, pool) if pool is not None else None)
        manifest.write(tmp)
        elapsed = time.perf_counter() - t0
        write_run_record(tmp, set_name, engine, manifest, {"write": elapsed})
    if progress:
        progress(f"wrote {set_name}: {len(shards)} shards, {manifest.n_tokens:,} tokens, {manifest.n_docs:,} docs "
                 f"in {elapsed:.1f}s")
    return manifest


def assemble_manifest(spec: MixtureSpec, tokenizer: Tokenizer, set_name: str, phase: str | None, order: str,
                      shards: list[ShardFile], components: list[ComponentUse], inputs: list, extra: dict[str, Any], *,
                      bucket_count: int | None, buckets: list[CompositionStats] | None) -> ShardManifest:
    """The set's manifest from per-shard results and the phase pool's bucket table (None for
    the eval set); both engines call this."""
    return build_manifest(
        shards=shards, tokenizer=tokenizer.identity, seq_len=spec.seq_len, stream=order, job=JOB,
        config=set_config(spec, set_name, phase, order), buckets=buckets or [], bucket_count=bucket_count,
        seeds=seeds_of(spec, [phase] if phase else []), spec_hash=spec.spec_hash(), components=components,
        inputs=inputs, counts={"n_shards": len(shards)}, extra=extra)


def write_run_record(directory: Path, set_name: str, engine: str, manifest: ShardManifest,
                     timings: dict[str, float]) -> None:
    record = RunManifest(job=JOB, config={"engine": engine, "set": set_name}, inputs=manifest.inputs,
                         counts={"n_tokens": manifest.n_tokens, "n_docs": manifest.n_docs, "n_shards": len(manifest.shards),
                                 "set_digest": manifest.set_digest},
                         timings_s={k: round(v, 3) for k, v in timings.items()}, outputs=[MANIFEST_NAME])
    atomic.write_json(directory / RUN_RECORD_NAME, record.to_json_dict())


def materialize(spec: MixtureSpec | str | os.PathLike, out_dir: str | os.PathLike, *, sets: list[str] | None = None,
                work_dir: str | os.PathLike | None = None, keep_work: bool = False,
                progress: Callable[[str], None] | None = None, force: bool = False,
                flat: bool = False) -> dict[str, ShardManifest]:
    """Materialize every shard set of a spec (or the named `sets`) under `out_dir/<set name>/`
    (with `flat=True` and exactly one set: at `out_dir` itself).

    Sets whose complete manifest records the same spec and inputs are reused (pass force=True to
    rewrite). Returns {set name: manifest}. A second writer of `out_dir` fails naming it: at once
    on the same machine (`storage.writer_lock`), at its commit on another (`storage.commit`).
    """
    with storage.writer_lock(out_dir):
        return _materialize(spec, out_dir, sets=sets, work_dir=work_dir, keep_work=keep_work, progress=progress,
                            force=force, flat=flat)


def _materialize(spec: MixtureSpec | str | os.PathLike, out_dir: str | os.PathLike, *, sets: list[str] | None,
                 work_dir: str | os.PathLike | None, keep_work: bool, progress: Callable[[str], None] | None,
                 force: bool, flat: bool) -> dict[str, ShardManifest]:
    progress = progress or (lambda m: log.info(m))
    if not isinstance(spec, MixtureSpec):
        spec = load_spec(spec)
    out = storage.path(out_dir)
    storage.makedirs(out.parent if flat else out)
    atomic.clean_stale_tmp(out.parent if flat else out)
    opened = check_components(spec)
    set_dir = lambda name: out if flat else out / name  # noqa: E731
    if flat and len(sets or set_names(spec)) != 1:
        raise ValueError(f"flat=True writes one set, this call makes {sets or [s[0] for s in set_names(spec)]}")
    tokenizer = load_tokenizer(spec.tokenizer)
    inputs = fingerprints([c.directory / MANIFEST_NAME for c in opened.values()])
    results, todo = select_sets(spec, set_dir, inputs, sets=sets, force=force, progress=progress)
    if not todo:
        return results
    work = Path(work_dir) if work_dir else storage.local_scratch(out.parent / f"{atomic.TMP_PREFIX}{out.name}.work-{spec.spec_hash()[:12]}"
                                            if flat else out / f".work-{spec.spec_hash()[:12]}")
    spills: dict[str, TokenSpill] = {}
    records: dict[str, dict[str, Any]] = {}
    for c in spec.components:
        spills[c.name], records[c.name] = tokenize_component(opened[c.name], c.score_field, tokenizer,
                                                             work / c.name, progress)
    comps = {c.name: spills[c.name].columns(c.name, opened[c.name].name) for c in spec.components}
    planned = plan_all(spec, comps)
    readers = {i: spills[c.name].reader(comps[c.name].n_tokens) for i, c in enumerate(spec.components)}
    ids = {i: comps[c.name].ids for i, c in enumerate(spec.components)}
    doc_source = lambda ci, row: readers[ci](row)  # noqa: E731
    doc_id = lambda ci, row: str(ids[ci][row])  # noqa: E731
    try:
        for i, (name, phase, order) in enumerate(todo, 1):
            plan = stream_plan(spec, planned, phase, order)
            uses = component_uses(spec, planned, plan, opened, records, phase)
            results[name] = write_set(set_dir(name), name, plan, doc_source, doc_id, spec, tokenizer, phase=phase,
                                      order=order, pool=planned.pools.get(phase) if phase else None, components=uses,
                                      inputs=inputs, progress=set_progress(progress, i, len(todo)))
    finally:
        for r in readers.values():
            r.close()
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return results


def materialize_slice(component: str | os.PathLike, out_dir: str | os.PathLike, *,
                      tokenizer: dict[str, Any] | Any, seq_len: int, seed: int = 0,
                      doc_ids: Iterable[str] | None = None, band: tuple[float, float] | None = None,
                      score_field: str | None = None, higher_is_better: bool = True,
                      n_tokens: int | None = None, progress: Callable[[str], None] | None = None) -> ShardManifest:
    """One component (or a slice of it) as a uniformly ordered shard set at `out_dir`: what a
    proxy run trains on. Pick the slice by `doc_ids`, by a within-component rank `band`
    (low, high) of `score_field` (0 = least preferred end), or a seeded `n_tokens` sample;
    with none of them, the whole component. `tokenizer` is a TokenizerSpec dict or object."""
    chosen = [x is not None for x in (doc_ids, band, n_tokens)]
    if sum(chosen) > 1:
        raise ValueError("give at most one of doc_ids, band, n_tokens")
    comp = Component.open(component)
    if doc_ids is not None:
        retention: dict[str, Any] = {"rule": "ids", "ids": sorted(set(doc_ids))}
    elif band is not None:
        retention = {"rule": "quantile_band", "low": float(band[0]), "high": float(band[1])}
    elif n_tokens is not None:
        retention = {"rule": "random_tokens", "n_tokens": int(n_tokens), "seed": seed}
    else:
        retention = {"rule": "all"}
    tok = tokenizer.model_dump() if hasattr(tokenizer, "model_dump") else dict(tokenizer)
    spec = MixtureSpec.model_validate({
        "name": f"slice-{comp.name}", "tokenizer": tok, "seq_len": seq_len, "bucket_count": 1,
        "seeds": {"uniform": seed, "budget": seed},
        "components": [{"name": comp.name, "path": str(comp.directory), "score_field": score_field,
                        "higher_is_better": higher_is_better, "retention": retention, "order_seed": seed}],
        "phases": [{"name": "slice", "orders": ["uniform"], "components": {comp.name: {}}}],
    })
    return materialize(spec, out_dir, flat=True, progress=progress)["slice-uniform"]
