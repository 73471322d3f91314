"""Curriculum math as pure functions on per-document columns (Puro §2.1, §3.4, §3.6.2).

Every function here works on numpy arrays of one component or one stream and is what both
materialization engines call: the local engine on whole columns, the Spark job on pandas batches
whose prefix sums it computed with a range-partitioned sort. Nothing here reads files.

Conventions
- A document's token mass `n_tokens` counts its stream tokens: its text tokens plus the EOS that
  separates it from the next document.
- `prefix` is the exclusive prefix sum of token mass in some order: the tokens before a document.
- Seeded randomness is a 64-bit xxh3 hash of (salt, component, doc id, copy) under a recorded
  seed; sorting by it is a seeded permutation that any engine reproduces exactly.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import xxhash

_TWO64 = float(1 << 64)


# ---- seeded keys --------------------------------------------------------------------------------

def doc_keys(ids: Sequence[str], seed: int, salt: str = "", copies: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """uint64 hash of each (salt, id[, copy]) under `seed`: the seeded tie-break and permutation key.

    Equal inputs give equal keys on any machine (xxh3-64, little-endian, independent of Python's
    hash randomisation). `salt` separates uses (which component, which phase, which purpose).
    """
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    h = xxhash.xxh3_64_intdigest
    prefix = salt + "\x1f"
    if copies is None:
        out = [h(prefix + str(i), seed) for i in ids]
    else:
        out = [h(f"{prefix}{i}\x1f{int(c)}", seed) for i, c in zip(ids, copies)]
    return np.array(out, dtype=np.uint64)


def signed_order_key(keys: np.ndarray) -> np.ndarray:
    """Map uint64 keys to int64 with the same order (for engines without unsigned types, e.g. Spark)."""
    return (np.asarray(keys, dtype=np.uint64) ^ np.uint64(1 << 63)).view(np.int64)


def preference_key(scores: np.ndarray | None, higher_is_better: bool, n: int | None = None) -> np.ndarray:
    """Sort key, ascending = less preferred first (Puro §3.4: "placing less preferred score ranges
    earlier"). Missing/NaN scores are least preferred (-inf). Unscored components get 0 for
    every document, so their order is the seeded tie-break alone (a fixed random order)."""
    if scores is None:
        return np.zeros(int(n or 0), dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    key = s if higher_is_better else -s
    return np.where(np.isnan(key), -np.inf, key) + 0.0   # + 0.0 turns -0.0 into 0.0


def preference_order(key: np.ndarray, tiebreak: np.ndarray, ids: Sequence[str] | None = None,
                     copies: np.ndarray | None = None) -> np.ndarray:
    """Indices that sort documents by ([copy,] key, tiebreak[, id]) ascending: the within-component
    order. Strings compare by code point, which is also the UTF-8 byte order engines use.

    Copy c of a document is ranked within pass c (all copies c, then all copies c + 1): copies
    share their document's key, so ordering by key first would put them side by side in one
    bucket; pass-major order puts them a pass apart, and each pass is itself less preferred first.
    """
    cols = [np.asarray(tiebreak, dtype=np.uint64), np.asarray(key, dtype=np.float64)]
    if ids is not None:
        cols.insert(0, np.asarray(ids, dtype=object).astype(str))
    if copies is not None:
        cols.append(np.asarray(copies, dtype=np.int64))
    return np.lexsort(cols)


def seeded_order(keys: np.ndarray, ids: Sequence[str]) -> np.ndarray:
    """Indices that sort by a seeded key, ties (64-bit collisions) broken by id: a seeded permutation."""
    return np.lexsort((np.asarray(ids, dtype=object).astype(str), np.asarray(keys, dtype=np.uint64)))


def rank_token_sum(prefix: np.ndarray, n_tokens: np.ndarray, total: int) -> float:
    """sum over documents of r(d) * n(d), computed exactly as sum(prefix * n) / total (Python
    integers, one correctly rounded division), so any engine and any summation order agree."""
    s = sum(int(p) * int(n) for p, n in zip(np.asarray(prefix).tolist(), np.asarray(n_tokens).tolist()))
    return s / int(total) if total else 0.0


# ---- rank by token mass ------------------------------------------------------------------------

def exclusive_cumsum(n_tokens: np.ndarray) -> np.ndarray:
    """Tokens before each document in the given order (of each column, for a 2-D array)."""
    n = np.asarray(n_tokens, dtype=np.int64)
    out = np.zeros_like(n)
    if n.shape and n.shape[0] > 1:
        np.cumsum(n[:-1], axis=0, out=out[1:])
    return out


def partition_offsets(partition_totals: np.ndarray) -> np.ndarray:
    """Exclusive prefix over per-partition totals (shape (n_partitions, n_groups)): what a
    distributed engine adds to each partition's local prefix sums to get exact global ones."""
    return exclusive_cumsum(partition_totals)


def rank_of(prefix: np.ndarray, total: int | np.ndarray) -> np.ndarray:
    """Normalized within-component rank r(d) = tokens before d / component tokens, in [0, 1)
    (Puro §3.4: "a rank of 0.25 means that approximately one quarter of the component's tokens
    appear earlier in its ordered sequence")."""
    total_arr = np.asarray(total, dtype=np.float64)
    return np.asarray(prefix, dtype=np.float64) / np.where(total_arr > 0, total_arr, 1.0)


def bucket_of(prefix: np.ndarray, total: int | np.ndarray, k: int) -> np.ndarray:
    """bucket = floor(r * K), in exact integer arithmetic: floor(prefix * K / total) (Puro §3.4:
    K rank intervals, bucket k takes the same interval from every component)."""
    if k < 1:
        raise ValueError(f"bucket count K must be >= 1, got {k}")
    p = np.asarray(prefix, dtype=np.int64)
    t = np.asarray(total, dtype=np.int64)
    if np.any(p * k // k != p):
        raise OverflowError("prefix * K overflows int64")
    return (p * k) // np.where(t > 0, t, 1)


def in_rank_band(prefix: np.ndarray, total: int | np.ndarray, low: float, high: float) -> np.ndarray:
    """Documents whose first token falls in the rank band [low, high) of the component."""
    r = rank_of(prefix, total)
    return (r >= low) & ((r < high) | (high >= 1.0))


# ---- retention and budgets ----------------------------------------------------------------------

def threshold_mask(scores: np.ndarray, threshold: float, higher_is_better: bool) -> np.ndarray:
    """Keep documents at least as preferred as `threshold`; missing scores are not kept."""
    s = np.asarray(scores, dtype=np.float64)
    ok = ~np.isnan(s)
    return ok & ((s >= threshold) if higher_is_better else (s <= threshold))


def take_budget(prefix: np.ndarray, budget: int) -> np.ndarray:
    """In a (seeded) order, keep the documents whose first token falls below `budget`: the kept
    mass exceeds the budget by less than one document."""
    return np.asarray(prefix, dtype=np.int64) < budget


def phase_budgets(retained_tokens: dict[str, int], weights: dict[str, float] | None,
                  budgets: dict[str, int | None], phase_tokens: int | None,
                  repeatable: dict[str, bool], supply: dict[str, int] | None = None) -> tuple[dict[str, int], int]:
    """Token budget B_c of each component in a phase, and the phase total.

    weights given:  B_c = round(w_c * P) with P = `phase_tokens`, or, when absent, the largest
                    total that needs no repetition of any component that may not repeat:
                    P = min_c T_c / w_c over those components (Puro §3.6.1: hand-set weights
                    over retained portions).
    budgets given:  B_c = n_tokens, or T_c when the entry is {} (everything retained).
    Raises ValueError naming the component when a budget needs more data than is retained and
    repetition is off, or more than its capped repetition can supply (`supply`, the tokens of
    every document times its copy cap, for the dup_count rules).
    """
    if weights:
        total = phase_tokens
        if total is None:
            limits = [retained_tokens[c] / w for c, w in weights.items() if w > 0 and not repeatable[c]]
            if not limits:
                limits = [retained_tokens[c] / w for c, w in weights.items() if w > 0]
            total = int(math.floor(min(limits)))
        out = {c: int(round(w * total)) for c, w in weights.items()}
    else:
        out = {c: (retained_tokens[c] if b is None else int(b)) for c, b in budgets.items()}
        total = sum(out.values())
    for c, b in out.items():
        if b > retained_tokens[c] and not repeatable[c]:
            raise ValueError(f"component '{c}' would need {b:,} tokens but retains {retained_tokens[c]:,} "
                             "and repeat is 'none' (lower its weight/budget or allow repetition)")
        if b > 0 and retained_tokens[c] == 0:
            raise ValueError(f"component '{c}' retains no tokens but has a budget of {b:,}")
        if supply is not None and c in supply and b > supply[c]:
            raise ValueError(f"component '{c}' would need {b:,} tokens but its capped repetition supplies at most "
                             f"{supply[c]:,} (it retains {retained_tokens[c]:,}; raise max_copies, use repeat: "
                             "uniform, or lower its weight/budget)")
    return out, int(total)


def floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 x) of positive integers, exactly (no floating point)."""
    v = np.asarray(x, dtype=np.int64).copy()
    out = np.zeros_like(v)
    while (v > 1).any():
        out += v > 1
        v >>= 1
    return out


def copy_caps(dup_count: np.ndarray, rule: str, max_copies: int) -> np.ndarray:
    """Most copies of each document a dup_count rule allows (missing / < 1 counts as 1):

    dup_count:      min(dup_count, max_copies)
    log_dup_count:  min(1 + floor(log2 dup_count), max_copies)

    The cap keeps repetition from undoing dedup: the largest clusters are templates and
    boilerplate, so a document with dup_count 5,000 must not fill buckets (issue 17).
    """
    d = np.maximum(np.asarray(dup_count, dtype=np.int64), 1)
    if rule == "dup_count":
        w = d
    elif rule == "log_dup_count":
        w = 1 + floor_log2(d)
    else:
        raise ValueError(f"unknown dup_count rule {rule!r} (dup_count or log_dup_count)")
    return np.minimum(w, int(max_copies))


def capped_supply(n_tokens: np.ndarray, caps: np.ndarray) -> int:
    """Tokens a component can supply under per-document copy caps: sum n(d) * cap(d)."""
    return int((np.asarray(n_tokens, dtype=np.int64) * np.asarray(caps, dtype=np.int64)).sum())


def extra_pass_masks(n_tokens: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Column c - 1 holds n(d) where document d has a copy in pass c (cap(d) > c), else 0, for
    c = 1 .. max(cap) - 1: one column per extra pass, so their count is bounded by max_copies,
    never by the largest dup_count."""
    n = np.asarray(n_tokens, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    n_pass = max(int(caps.max(initial=1)) - 1, 0)
    passes = np.arange(1, n_pass + 1, dtype=np.int64)
    return np.where(caps[:, None] > passes[None, :], n[:, None], 0)


def capped_extra_copies(caps: np.ndarray, pass_prefix: np.ndarray, pass_mass: np.ndarray, extra: int) -> np.ndarray:
    """Extra copies of each document from the capped passes, in one step.

    Pass c (c = 1, 2, ...) holds copy c of every document allowed more than c copies; passes are
    taken in order, each in the seeded budget order, while the first token of a copy falls below
    the `extra` tokens still missing. Copy c of d starts at S_c + P_c(d): the mass of the passes
    before c (from `pass_mass`, the column totals of `extra_pass_masks`) plus its exclusive prefix
    inside pass c (`pass_prefix`, those columns' prefix sums in budget order). This is the
    round-by-round rule (round c takes its eligible documents while their prefix is below what
    is still missing) written as one expression, so a distributed engine needs one sort and one
    aggregation whatever the dup_counts are.
    """
    caps = np.asarray(caps, dtype=np.int64)
    prefix = np.asarray(pass_prefix, dtype=np.int64).reshape(caps.size, -1)
    passes = np.arange(1, prefix.shape[1] + 1, dtype=np.int64)
    before = exclusive_cumsum(np.asarray(pass_mass, dtype=np.int64))
    taken = (caps[:, None] > passes[None, :]) & (before[None, :] + prefix < int(extra))
    return taken.sum(axis=1).astype(np.int64)


def repeat_copies(n_tokens_budget_order: np.ndarray, budget: int, caps: np.ndarray | None = None) -> np.ndarray:
    """How many times each retained document appears so a component reaches `budget` tokens.

    Arrays are in the component's seeded budget order. Below the retained mass: a seeded subset
    (copies 0/1, `take_budget`). Above it, without caps (repeat: uniform): whole passes plus the
    seeded first documents once more (`pass_copies`); with per-document copy caps (the dup_count
    rules, `copy_caps`): the capped passes of `capped_extra_copies`, never more than cap(d) copies.
    """
    n = np.asarray(n_tokens_budget_order, dtype=np.int64)
    total = int(n.sum())
    if budget <= total:
        return take_budget(exclusive_cumsum(n), budget).astype(np.int64)
    extra = budget - total
    if caps is None:
        return 1 + pass_copies(exclusive_cumsum(n), total, extra)
    masks = extra_pass_masks(n, caps)
    return 1 + capped_extra_copies(caps, exclusive_cumsum(masks), masks.sum(axis=0), extra)


def pass_copies(prefix: np.ndarray, total: int, extra: int) -> np.ndarray:
    """Extra copies from whole passes over a component of `total` tokens: floor(extra / total)
    for every document, plus one for the documents starting in the remainder."""
    passes, rem = divmod(int(extra), int(total))
    return passes + (np.asarray(prefix, dtype=np.int64) < rem).astype(np.int64)


def expand_copies(copies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, copy) pairs for a per-row copy count: row i appears copies[i] times, as copy 0..c-1."""
    c = np.asarray(copies, dtype=np.int64)
    rows = np.repeat(np.arange(c.size, dtype=np.int64), c)
    starts = np.repeat(exclusive_cumsum(c), c)
    return rows, np.arange(rows.size, dtype=np.int64) - starts


# ---- streams ------------------------------------------------------------------------------------

def uniform_slot(keys: np.ndarray, k: int) -> np.ndarray:
    """floor(key * K / 2^64), exactly: the uniform stream's K equal hash ranges (its segments).
    Sorting by key then reads slot 0, 1, ...: one seeded global shuffle cut into K files."""
    h = np.asarray(keys, dtype=np.uint64)
    hi = (h >> np.uint64(32)).astype(np.int64)
    lo = (h & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return (hi * k + ((lo * k) >> 32)) >> 32


def part_of(prefix_in_segment: np.ndarray, shard_tokens: int) -> np.ndarray:
    """Shard file index inside a segment: the part where the document's first token falls."""
    return np.asarray(prefix_in_segment, dtype=np.int64) // int(shard_tokens)


def segment_name(kind: str, index: int | np.ndarray) -> str | list[str]:
    """b0003 (bucket 3), u0003 (uniform slot 3), t0000 (transition), e0000 (eval)."""
    letter = {"curriculum": "b", "uniform": "u", "transition": "t", "eval": "e", "slice": "s", "sft": "f"}[kind]
    if isinstance(index, (int, np.integer)):
        return f"{letter}{int(index):04d}"
    return [f"{letter}{int(i):04d}" for i in index]


def shard_name(segment: str, part: int) -> str:
    return f"{segment}-{int(part):03d}"


# ---- phase transition (Puro §3.6.2) -------------------------------------------------------------

def transition_p2_position(p2_prefix: np.ndarray, transition_tokens: int) -> np.ndarray:
    """Stream position x where a phase-2 document is due: the cumulative phase-2 mass under the
    linearly rising weight w2(x) = x/L is x^2/(2L), so the document whose first token is at
    phase-2 offset S starts at x = sqrt(2 L S)."""
    s = np.asarray(p2_prefix, dtype=np.float64)
    return np.sqrt(2.0 * float(transition_tokens) * s)


def transition_p1_position(p1_prefix: np.ndarray, transition_tokens: int) -> np.ndarray:
    """Stream position x where a phase-1 replay document is due: the cumulative replay mass under
    the linearly falling weight w1(x) = 1 - x/L is x - x^2/(2L); solving for replay offset R gives
    x = L (1 - sqrt(1 - 2R/L)), defined for R <= L/2 (the replay side's whole share)."""
    L = float(transition_tokens)
    r = np.minimum(np.asarray(p1_prefix, dtype=np.float64) / L, 0.5)
    return L * (1.0 - np.sqrt(np.maximum(1.0 - 2.0 * r, 0.0)))


def in_transition(prefix: np.ndarray, transition_tokens: int) -> np.ndarray:
    """Documents (of either side) that the transition takes: those starting in the first L/2
    tokens of their side, each side contributing about L/2 (Puro: 21.9B of 43.9B each)."""
    return 2 * np.asarray(prefix, dtype=np.int64) < int(transition_tokens)


def transition_order(p1_prefix: np.ndarray, p2_prefix: np.ndarray, transition_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Interleave the transition's replay documents (side 0) and phase-2 documents (side 1) by the
    position where the linear schedule says each one is due (replay first on ties, since its
    weight is 1 at x = 0). Inputs are the side-local prefixes of the documents `in_transition`,
    in each side's stream order. Returns (side, index within side) in stream order."""
    t1 = transition_p1_position(p1_prefix, transition_tokens)
    t2 = transition_p2_position(p2_prefix, transition_tokens)
    times = np.concatenate([t1, t2])
    side = np.concatenate([np.zeros(t1.size, dtype=np.int64), np.ones(t2.size, dtype=np.int64)])
    idx = np.concatenate([np.arange(t1.size, dtype=np.int64), np.arange(t2.size, dtype=np.int64)])
    order = np.lexsort((idx, side, times))
    return side[order], idx[order]


def linear_p2_share(x: np.ndarray | float, transition_tokens: int) -> np.ndarray:
    """The schedule itself: the phase-2 sampling weight at stream position x (clipped to [0, 1])."""
    return np.clip(np.asarray(x, dtype=np.float64) / float(transition_tokens), 0.0, 1.0)


# ---- held-out set -------------------------------------------------------------------------------

def holdout_mask(keys: np.ndarray, fraction: float) -> np.ndarray:
    """Documents whose seeded key falls in the lowest `fraction` of the 64-bit range."""
    cut = np.uint64(min(int(fraction * _TWO64), (1 << 64) - 1))
    return np.asarray(keys, dtype=np.uint64) < cut
