"""From per-document columns to stream plans: the local engine's planning, no I/O.

Puro's reconstructed algorithm (seed-puro.md §2.1) step by step, each step one function:

1. `holdout_masks`     a seeded held-out eval set, excluded from every phase
2. `retention_mask`    the component's retention rule (all, threshold, top fraction, rank band,
                       random tokens)
3. `plan_phase_pool`   phase budgets from weights/budgets (repetition if allowed: whole passes,
                       or passes capped by dup_count), then the within-component order (pass,
                       score direction, seeded tie-break), rank by token mass, bucket = floor(r * K)
4. `plan_stream`       curriculum (buckets in order, seeded shuffle inside each) or uniform (one
                       seeded global shuffle) from the same pool, the phase transition merged in,
                       documents assigned to shard files
5. `plan_eval`         the held-out set in a seeded order

The Spark engine (kaiyuan/spark/materialize.py) computes the same columns with the same
`mixtures.curriculum` functions on DataFrames; the byte-identity test holds the two together.
Seeded keys always hash "<component>\\x1f<doc id>" with the copy number, under a salt naming the
purpose and phase, so no two uses share randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mixtures import curriculum as cm
from mixtures.shards import CompositionStats, composition_from_sums
from mixtures.spec import ComponentSpec, MixtureSpec, PhaseSpec


@dataclass
class ComponentColumns:
    """What planning needs of one component: one entry per valid document, in read order."""

    name: str
    ids: np.ndarray                     # str (object)
    n_tokens: np.ndarray                # int64 stream tokens (text + EOS)
    scores: np.ndarray | None = None    # float64, NaN = missing
    dup_count: np.ndarray | None = None
    source: str = ""                    # the component manifest's name; aliases of one source share it

    def __post_init__(self) -> None:
        self.source = self.source or self.name
        self.ids = np.asarray(self.ids, dtype=object)
        self.n_tokens = np.asarray(self.n_tokens, dtype=np.int64)
        self.uids = np.array([f"{self.name}\x1f{i}" for i in self.ids], dtype=object)

    def __len__(self) -> int:
        return int(self.n_tokens.size)


@dataclass
class Pool:
    """A phase's pool: one row per (document, copy), with its within-component rank and bucket."""

    comp: np.ndarray          # int64 index into spec.components
    row: np.ndarray           # int64 row in ComponentColumns
    copy: np.ndarray          # int64
    n_tokens: np.ndarray      # int64
    rank: np.ndarray          # float64
    bucket: np.ndarray        # int64
    prefix: np.ndarray        # int64 tokens before the document in its component's order
    bucket_count: int
    comp_total: dict[int, int] = field(default_factory=dict)           # tokens used per component
    details: dict[str, dict[str, Any]] = field(default_factory=dict)   # per component

    def __len__(self) -> int:
        return int(self.comp.size)


@dataclass
class StreamPlan:
    """Documents in stream order, each assigned to a segment and a shard file (part)."""

    comp: np.ndarray
    row: np.ndarray
    copy: np.ndarray
    n_tokens: np.ndarray
    rank: np.ndarray
    bucket: np.ndarray
    label: np.ndarray          # int64 index into `labels` (component name, or "replay:<name>")
    labels: list[str]
    segment: np.ndarray        # str (object)
    part: np.ndarray           # int64
    extra: dict[str, Any] = field(default_factory=dict)

    def files(self) -> list[tuple[str, str, np.ndarray]]:
        """(segment, shard name, row positions in stream order) for each shard file, in order."""
        out: list[tuple[str, str, np.ndarray]] = []
        if self.comp.size == 0:
            return out
        key = np.array([f"{s}\x1f{p}" for s, p in zip(self.segment, self.part)], dtype=object)
        change = np.flatnonzero(key[1:] != key[:-1]) + 1
        bounds = np.concatenate([[0], change, [key.size]])
        for a, b in zip(bounds[:-1], bounds[1:]):
            out.append((str(self.segment[a]), cm.shard_name(self.segment[a], self.part[a]), np.arange(a, b)))
        return out


# ---- 1. held-out set ----------------------------------------------------------------------------

def holdout_key_ids(source: str, ids: np.ndarray) -> list[str]:
    """What the held-out key hashes: the source (component manifest name) and the doc id, so two
    spec components reading the same source (aliases with different retention) hold out the
    same documents."""
    return [f"{source}\x1f{i}" for i in ids]


def eval_components(spec: MixtureSpec, sources: dict[str, str]) -> list[str]:
    """Components whose held-out documents form the eval set: the first of each source."""
    seen: set[str] = set()
    out = []
    for c in spec.components:
        if sources[c.name] not in seen:
            seen.add(sources[c.name])
            out.append(c.name)
    return out


def holdout_masks(spec: MixtureSpec, comps: dict[str, ComponentColumns]) -> dict[str, np.ndarray]:
    out = {}
    for name, cols in comps.items():
        if spec.holdout is None:
            out[name] = np.zeros(len(cols), dtype=bool)
        else:
            keys = cm.doc_keys(holdout_key_ids(cols.source, cols.ids), spec.seeds.holdout, salt="holdout")
            out[name] = cm.holdout_mask(keys, spec.holdout.fraction)
    return out


# ---- 2. retention -------------------------------------------------------------------------------

def order_tiebreak(c: ComponentSpec, uids: np.ndarray, copies: np.ndarray | None = None) -> np.ndarray:
    """The component's seeded tie-break (and, unscored, its whole fixed random order)."""
    return cm.doc_keys(uids, c.order_seed, salt="order", copies=np.zeros(len(uids), np.int64) if copies is None else copies)


def within_component_order(c: ComponentSpec, cols: ComponentColumns, rows: np.ndarray,
                           copies: np.ndarray | None = None) -> np.ndarray:
    """Positions into `rows` in the component's order: less preferred first (Puro §3.4)."""
    scores = None if c.score_field is None else cols.scores[rows]
    key = cm.preference_key(scores, c.higher_is_better, n=len(rows))
    tie = order_tiebreak(c, cols.uids[rows], copies)
    return cm.preference_order(key, tie, cols.uids[rows], copies)


def retention_mask(c: ComponentSpec, cols: ComponentColumns, eligible: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """Which eligible documents the component's retention rule keeps (Puro §3.6.1)."""
    rule = c.retention
    rows = np.flatnonzero(eligible)
    keep = np.zeros(len(cols), dtype=bool)
    details: dict[str, Any] = {"rule": rule.model_dump(mode="json")}
    if rule.rule == "all":
        keep[rows] = True
    elif rule.rule == "threshold":
        keep[rows] = cm.threshold_mask(cols.scores[rows], rule.threshold, c.higher_is_better)
        details["n_docs_no_score"] = int(np.isnan(cols.scores[rows]).sum())
    elif rule.rule in ("top_fraction", "quantile_band"):
        low, high = (1.0 - rule.fraction, 1.0) if rule.rule == "top_fraction" else (rule.low, rule.high)
        order = within_component_order(c, cols, rows)
        prefix = cm.exclusive_cumsum(cols.n_tokens[rows][order])
        total = int(cols.n_tokens[rows].sum())
        keep[rows[order]] = cm.in_rank_band(prefix, total, low, high)
        details["rank_band"] = [low, high]
    elif rule.rule == "ids":
        wanted = rule.id_set()
        keep[rows] = np.fromiter((i in wanted for i in cols.ids[rows]), dtype=bool, count=rows.size)
        details["n_ids_missing"] = len(wanted - set(cols.ids[keep].tolist()))
    elif rule.rule == "random_tokens":
        order = cm.seeded_order(cm.doc_keys(cols.uids[rows], rule.seed, salt="retain"), cols.uids[rows])
        prefix = cm.exclusive_cumsum(cols.n_tokens[rows][order])
        keep[rows[order]] = cm.take_budget(prefix, rule.n_tokens)
    return keep, details


# ---- 3. phase pool ------------------------------------------------------------------------------

def copy_caps(c: ComponentSpec, cols: ComponentColumns) -> np.ndarray | None:
    """Per-document copy caps of a dup_count rule (None: uncapped or no repetition)."""
    if not c.dup_weighted:
        return None
    dup = cols.dup_count if cols.dup_count is not None else np.ones(len(cols), dtype=np.int64)
    return cm.copy_caps(dup, c.repeat, c.max_copies)


def plan_phase_pool(spec: MixtureSpec, phase: PhaseSpec, comps: dict[str, ComponentColumns],
                    retained: dict[str, np.ndarray]) -> Pool:
    """Budgets, repetition, within-component rank and bucket for one phase (Puro §3.4)."""
    K = spec.bucket_count_of(phase)
    names = list(phase.components)
    retained_tokens = {n: int(comps[n].n_tokens[retained[n]].sum()) for n in names}
    weights = {n: s.weight for n, s in phase.components.items()} if phase.weighted else None
    budgets = {n: s.n_tokens for n, s in phase.components.items()}
    repeatable = {n: spec.component(n).repeat != "none" for n in names}
    caps = {n: copy_caps(spec.component(n), comps[n]) for n in names}
    supply = {n: cm.capped_supply(comps[n].n_tokens[retained[n]], caps[n][retained[n]])
              for n in names if caps[n] is not None}
    b, total = cm.phase_budgets(retained_tokens, weights, budgets, phase.n_tokens, repeatable, supply)
    parts: list[tuple[np.ndarray, ...]] = []
    details: dict[str, dict[str, Any]] = {}
    comp_index = {c.name: i for i, c in enumerate(spec.components)}
    for n in names:
        c, cols = spec.component(n), comps[n]
        rows = np.flatnonzero(retained[n])
        order = cm.seeded_order(cm.doc_keys(cols.uids[rows], spec.seeds.budget, salt=f"budget:{phase.name}"),
                                cols.uids[rows])
        rows = rows[order]
        copies = cm.repeat_copies(cols.n_tokens[rows], b[n], None if caps[n] is None else caps[n][rows])
        sel, copy = cm.expand_copies(copies)
        rows, copy = rows[sel], copy
        o = within_component_order(c, cols, rows, copy)
        rows, copy = rows[o], copy[o]
        n_tok = cols.n_tokens[rows]
        prefix = cm.exclusive_cumsum(n_tok)
        t_used = int(n_tok.sum())
        parts.append((np.full(rows.size, comp_index[n], dtype=np.int64), rows, copy, n_tok,
                      cm.rank_of(prefix, t_used), cm.bucket_of(prefix, t_used, K), prefix))
        details[n] = {"budget_tokens": b[n], "n_tokens_retained": retained_tokens[n], "n_tokens_used": t_used,
                      "n_docs_used": int(rows.size), "n_repeated_docs": int((copy > 0).sum())}
    cols_ = [np.concatenate([p[i] for p in parts]) for i in range(7)]
    comp_total = {comp_index[n]: details[n]["n_tokens_used"] for n in names}
    pool = Pool(*cols_, bucket_count=K, comp_total=comp_total, details=details)
    pool.details["_phase"] = {"n_tokens": int(pool.n_tokens.sum()), "target_tokens": total}
    return pool


def bucket_stats(spec: MixtureSpec, pool: Pool) -> list[CompositionStats]:
    """Per-bucket token counts by component and token-weighted mean rank (the manifest's table)."""
    K = pool.bucket_count
    out = []
    for k in range(K):
        m = pool.bucket == k
        tokens: dict[str, int] = {}
        rank_sums: dict[str, float] = {}
        for ci in np.unique(pool.comp[m]):
            mc = m & (pool.comp == ci)
            name = spec.components[int(ci)].name
            tokens[name] = int(pool.n_tokens[mc].sum())
            rank_sums[name] = cm.rank_token_sum(pool.prefix[mc], pool.n_tokens[mc], pool.comp_total[int(ci)])
        out.append(composition_from_sums(cm.segment_name("curriculum", k), int(pool.n_tokens[m].sum()),
                                         int(m.sum()), tokens, rank_sums))
    return out


# ---- 4. streams ---------------------------------------------------------------------------------

def _stream_keys(comps: dict[str, ComponentColumns], spec: MixtureSpec, comp: np.ndarray, row: np.ndarray,
                 copy: np.ndarray, seed: int, salt: str) -> tuple[np.ndarray, np.ndarray]:
    uids = np.empty(comp.size, dtype=object)
    for ci in np.unique(comp):
        m = comp == ci
        uids[m] = comps[spec.components[int(ci)].name].uids[row[m]]
    return cm.doc_keys(uids, seed, salt=salt, copies=copy), uids


def pool_order(spec: MixtureSpec, phase: PhaseSpec, pool: Pool, comps: dict[str, ComponentColumns],
               order: str) -> tuple[np.ndarray, np.ndarray]:
    """Stream order of a pool and each document's segment index.

    curriculum: bucket 0, 1, ... K-1, a seeded shuffle inside each (Puro §3.4, §3.6.2).
    uniform:    one seeded global shuffle of the same documents (Puro: UD "globally reshuffles
                the Phase 2 pool"), cut into K files by hash range.
    """
    if order == "curriculum":
        keys, uids = _stream_keys(comps, spec, pool.comp, pool.row, pool.copy, spec.seeds.bucket_shuffle,
                                  f"bucket:{phase.name}")
        seg = pool.bucket
    elif order == "uniform":
        keys, uids = _stream_keys(comps, spec, pool.comp, pool.row, pool.copy, spec.seeds.uniform,
                                  f"uniform:{phase.name}")
        seg = cm.uniform_slot(keys, pool.bucket_count)
    else:
        raise ValueError(f"unknown order {order!r} (curriculum or uniform)")
    o = np.lexsort((pool.copy, uids.astype(str), keys, seg))
    return o, seg[o]


def plan_stream(spec: MixtureSpec, phase: PhaseSpec, pool: Pool, comps: dict[str, ComponentColumns],
                order: str, replay_pool: Pool | None = None, replay_phase: PhaseSpec | None = None) -> StreamPlan:
    o, seg_idx = pool_order(spec, phase, pool, comps, order)
    labels = [c.name for c in spec.components]
    comp, row, copy = pool.comp[o], pool.row[o], pool.copy[o]
    n_tok, rank, bucket = pool.n_tokens[o], pool.rank[o], pool.bucket[o]
    label = comp.copy()
    segment = np.array(cm.segment_name(order, seg_idx), dtype=object) if o.size else np.array([], dtype=object)
    extra: dict[str, Any] = {}
    L = phase.transition_tokens
    if L and replay_pool is not None:
        # replay side: the previous phase's pool in a seeded order; phase-2 side: the stream's head
        rkeys, ruids = _stream_keys(comps, spec, replay_pool.comp, replay_pool.row, replay_pool.copy,
                                    spec.seeds.replay, f"replay:{phase.name}")
        ro = np.lexsort((replay_pool.copy, ruids.astype(str), rkeys))
        r_prefix = cm.exclusive_cumsum(replay_pool.n_tokens[ro])
        r_take = cm.in_transition(r_prefix, L)
        ro = ro[r_take]
        p_prefix = cm.exclusive_cumsum(n_tok)
        p_take = cm.in_transition(p_prefix, L)
        side, idx = cm.transition_order(r_prefix[r_take], p_prefix[p_take], L)
        p_rows = np.flatnonzero(p_take)
        labels = labels + [f"replay:{c.name}" for c in spec.components]
        n_comp = len(spec.components)
        take = lambda a_r, a_p: _take_sides(side, idx, a_r[ro], a_p[p_rows])  # noqa: E731
        t_comp, t_row, t_copy = take(replay_pool.comp, comp), take(replay_pool.row, row), take(replay_pool.copy, copy)
        t_ntok, t_rank = take(replay_pool.n_tokens, n_tok), take(replay_pool.rank, rank)
        t_bucket = take(np.full(len(replay_pool), -1, dtype=np.int64), bucket)
        t_label = np.where(side == 0, t_comp + n_comp, t_comp)
        rest = ~p_take
        comp = np.concatenate([t_comp, comp[rest]])
        row = np.concatenate([t_row, row[rest]])
        copy = np.concatenate([t_copy, copy[rest]])
        n_tok = np.concatenate([t_ntok, n_tok[rest]])
        rank = np.concatenate([t_rank, rank[rest]])
        bucket = np.concatenate([t_bucket, bucket[rest]])
        label = np.concatenate([t_label, label[rest]])
        segment = np.concatenate([np.array([cm.segment_name("transition", 0)] * side.size, dtype=object), segment[rest]])
        extra["transition"] = {"from_phase": replay_phase.name if replay_phase else None, "transition_tokens": int(L),
                               "replay_tokens": int(replay_pool.n_tokens[ro].sum()),
                               "phase_tokens": int(n_tok[:side.size][side == 1].sum()),
                               "window_tokens": int(n_tok[:side.size].sum())}
    part = _parts(segment, n_tok, spec.shard_tokens)
    return StreamPlan(comp, row, copy, n_tok, rank, bucket, label, labels, segment, part, extra)


def _take_sides(side: np.ndarray, idx: np.ndarray, a_replay: np.ndarray, a_phase: np.ndarray) -> np.ndarray:
    out = np.empty(side.size, dtype=np.result_type(a_replay, a_phase))
    m = side == 0
    out[m] = a_replay[idx[m]]
    out[~m] = a_phase[idx[~m]]
    return out


def _parts(segment: np.ndarray, n_tokens: np.ndarray, shard_tokens: int) -> np.ndarray:
    part = np.zeros(segment.size, dtype=np.int64)
    if segment.size == 0:
        return part
    change = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    bounds = np.concatenate([[0], change, [segment.size]])
    for a, b in zip(bounds[:-1], bounds[1:]):
        part[a:b] = cm.part_of(cm.exclusive_cumsum(n_tokens[a:b]), shard_tokens)
    return part


# ---- 5. eval ------------------------------------------------------------------------------------

def plan_eval(spec: MixtureSpec, comps: dict[str, ComponentColumns], held: dict[str, np.ndarray]) -> StreamPlan:
    """The held-out documents of every component, in one seeded order, capped at max_tokens."""
    comp_index = {c.name: i for i, c in enumerate(spec.components)}
    first = set(eval_components(spec, {n: c.source for n, c in comps.items()}))
    cs, rs = [], []
    for name, mask in held.items():
        if name not in first:
            continue
        rows = np.flatnonzero(mask)
        cs.append(np.full(rows.size, comp_index[name], dtype=np.int64))
        rs.append(rows)
    comp = np.concatenate(cs) if cs else np.zeros(0, np.int64)
    row = np.concatenate(rs) if rs else np.zeros(0, np.int64)
    copy = np.zeros(comp.size, dtype=np.int64)
    keys, uids = _stream_keys(comps, spec, comp, row, copy, spec.seeds.holdout, "eval")
    o = np.lexsort((uids.astype(str), keys))
    comp, row, copy = comp[o], row[o], copy[o]
    n_tok = np.empty(comp.size, dtype=np.int64)
    for ci in np.unique(comp):
        m = comp == ci
        n_tok[m] = comps[spec.components[int(ci)].name].n_tokens[row[m]]
    if spec.holdout is not None and spec.holdout.max_tokens:
        keep = cm.take_budget(cm.exclusive_cumsum(n_tok), spec.holdout.max_tokens)
        comp, row, copy, n_tok = comp[keep], row[keep], copy[keep], n_tok[keep]
    segment = np.array([cm.segment_name("eval", 0)] * comp.size, dtype=object)
    return StreamPlan(comp, row, copy, n_tok, np.full(comp.size, np.nan), np.full(comp.size, -1, np.int64),
                      comp.copy(), [c.name for c in spec.components], segment, _parts(segment, n_tok, spec.shard_tokens))
