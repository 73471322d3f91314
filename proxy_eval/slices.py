"""Slice plans: which data slices of which components get a proxy run (Puro §3.6.1).

Puro's three sampling rules, with every number configurable (`SliceRules`):
1. a component above `quantile_min_tokens` (50B) with a usable score gets local slices around the
   0th, 25th, 50th and 75th percentile positions of its score ranking (a within-source quantile
   benchmark);
2. a component of `random_min_tokens` (5B) up to 50B, or a larger one without a usable score, gets
   one random slice;
3. smaller components are not evaluated.

Percentile positions are measured in token mass along the component's *preference* order. The paper's
q00 is evidently the best-scored end (DCLM-Dedup q00 ranks 3rd, q25 11th, and the retained region is
the top 5%; spec seed-puro.md §3.1), so the default origin is `best`, and the origin is part of
every slice name: `dclm.q00-from-best`, `dclm.q25-from-best`, ...; random slices are `name.random`.

Pure functions here decide plans and pick documents from per-document records (scores, tokens,
seeded keys); `proxy_eval.plan` streams a component's files through the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Sequence

import numpy as np
from pydantic import Field, model_validator

from purokit.config import StrictModel
from purokit.errors import ContractError
from mixtures import curriculum as cm

PercentileFrom = Literal["best", "worst"]
Anchor = Literal["start", "center"]


class SliceRules(StrictModel):
    """The numbers behind Puro's slice rules. Defaults are the paper's (Puro §3.6.1)."""

    slice_tokens: int = Field(4_000_000_000, gt=0, description="target tokens per slice (paper: 4B)")
    quantile_min_tokens: int = Field(50_000_000_000, ge=0, description="above this, a scored component gets quantile slices")
    random_min_tokens: int = Field(5_000_000_000, ge=0, description="at or above this, one random slice")
    percentiles: list[float] = Field(default_factory=lambda: [0.0, 25.0, 50.0, 75.0])
    percentile_from: PercentileFrom = "best"
    # `center`: the slice is centred on the percentile position (clamped to the component), which is
    # what "local slices around the percentile positions" says; `start`: it begins there.
    anchor: Anchor = "center"
    min_scored_fraction: float = Field(0.9, ge=0.0, le=1.0,
                                       description="a score is usable when at least this token fraction has one")
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "SliceRules":
        if self.random_min_tokens > self.quantile_min_tokens:
            raise ValueError(f"random_min_tokens ({self.random_min_tokens}) must not exceed quantile_min_tokens "
                             f"({self.quantile_min_tokens})")
        ps = self.percentiles
        if not ps or any(p < 0 or p >= 100 for p in ps) or sorted(set(ps)) != list(ps):
            raise ValueError(f"percentiles must be strictly increasing values in [0, 100), got {ps}")
        return self


class SliceSpec(StrictModel):
    """One slice to evaluate. `band` is the token-mass interval in the component's preference
    order, best first: [0, 0.01) is the best-scored 1% of tokens."""

    name: str
    component: str
    kind: Literal["quantile", "random"]
    target_tokens: int
    percentile: float | None = None
    percentile_from: PercentileFrom | None = None
    band: tuple[float, float] | None = None
    score_field: str | None = None
    higher_is_better: bool = True
    seed: int = 0


class ComponentDecision(StrictModel):
    component: str
    n_tokens: int
    scored: bool
    rule: Literal["quantile", "random", "skip"]
    reason: str
    slices: list[SliceSpec] = Field(default_factory=list)


def slice_name(component: str, kind: str, percentile: float | None = None,
               percentile_from: PercentileFrom | None = None) -> str:
    """`dclm.q00-from-best`, `dclm.q25-from-best`, `fineweb_cn.random` (Puro's q00 = best end)."""
    if kind == "random":
        return f"{component}.random"
    assert percentile is not None and percentile_from is not None
    p = f"{percentile:g}".replace(".", "p")
    return f"{component}.q{p.zfill(2)}-from-{percentile_from}"


def percentile_band(percentile: float, slice_fraction: float, anchor: Anchor) -> tuple[float, float]:
    """Token-mass interval [lo, hi) of a slice around a percentile position, clamped to [0, 1]."""
    pos = percentile / 100.0
    f = min(1.0, slice_fraction)
    lo = pos - f / 2 if anchor == "center" else pos
    lo = min(max(lo, 0.0), 1.0 - f)
    return (lo, lo + f)


def decide_component(component: str, n_tokens: int, scored: bool, rules: SliceRules,
                     score_field: str | None = None, higher_is_better: bool = True) -> ComponentDecision:
    """Apply Puro's three rules to one component (Puro §3.6.1). Pure."""
    gb = lambda n: f"{n / 1e9:.3g}B" if n >= 1e8 else f"{n:,}"  # noqa: E731
    big = n_tokens > rules.quantile_min_tokens
    if big and scored:
        frac = rules.slice_tokens / n_tokens
        slices = []
        for p in rules.percentiles:
            slices.append(SliceSpec(
                name=slice_name(component, "quantile", p, rules.percentile_from), component=component,
                kind="quantile", target_tokens=rules.slice_tokens, percentile=p,
                percentile_from=rules.percentile_from, band=percentile_band(p, frac, rules.anchor),
                score_field=score_field, higher_is_better=higher_is_better, seed=rules.seed,
            ))
        bands = [s.band for s in slices]
        for a, b in zip(bands, bands[1:]):
            if a[1] > b[0] + 1e-12:
                raise ContractError(f"component '{component}'", (
                    f"quantile slices of {gb(rules.slice_tokens)} tokens overlap in a component of {gb(n_tokens)} "
                    f"(bands {a} and {b}); lower slice_tokens or use fewer percentiles"), field="slice_tokens")
        return ComponentDecision(component=component, n_tokens=n_tokens, scored=True, rule="quantile",
                                 reason=f"{gb(n_tokens)} > {gb(rules.quantile_min_tokens)} and scored", slices=slices)
    if n_tokens >= rules.random_min_tokens:
        why = (f"{gb(n_tokens)} > {gb(rules.quantile_min_tokens)} but no usable score" if big
               else f"{gb(rules.random_min_tokens)} <= {gb(n_tokens)} <= {gb(rules.quantile_min_tokens)}")
        spec = SliceSpec(name=slice_name(component, "random"), component=component, kind="random",
                         target_tokens=min(rules.slice_tokens, n_tokens), seed=rules.seed,
                         score_field=score_field if scored else None, higher_is_better=higher_is_better)
        return ComponentDecision(component=component, n_tokens=n_tokens, scored=scored, rule="random",
                                 reason=why, slices=[spec])
    return ComponentDecision(component=component, n_tokens=n_tokens, scored=scored, rule="skip",
                             reason=f"{gb(n_tokens)} < {gb(rules.random_min_tokens)}: not evaluated")


# ---- picking documents ------------------------------------------------------------------------
#
# The one selection function, used in memory (`select_slices`) and streaming over a component's
# files (`proxy_eval.plan`), whose result the Spark spec then names by id:
# - order: the preference order from the origin end (best first for `percentile_from: best`), ties
#   broken by the seeded xxh3 key of `mixtures.curriculum.doc_keys` (the hash every engine uses),
#   then by row; documents without a score (NaN) take no part in quantile slices;
# - token mass: the component's `n_tokens` (text tokens), the unit of `slice_tokens`;
# - a slice is the run of documents from the one holding its band's first token to the one holding
#   its `target_tokens`-th token: at least the target, within one document of it.
# Everything is a comparison of per-document records (`KEY_DTYPE`), so the streaming engine needs
# only a few passes over them and memory flat in the number of documents.

KEY_DTYPE = np.dtype([("key", "<u8"), ("tie", "<u8"), ("mass", "<i8"), ("flags", "u1")])
ELIGIBLE, SCORED = 1, 2          # flags: not excluded (eval documents); has a finite score
_SIGN = np.uint64(1 << 63)
CANDIDATES = 1 << 20             # documents sorted exactly in memory when locating a position


def doc_hash_keys(ids: Sequence[str], seed: int, salt: str = "") -> np.ndarray:
    """A seeded pseudo-random uint64 per document id: order-free and the same on any machine
    (`mixtures.curriculum.doc_keys`, xxh3-64)."""
    return cm.doc_keys([str(i) for i in ids], seed, salt=salt)


def order_key(scores: np.ndarray, higher_is_better: bool, percentile_from: PercentileFrom) -> np.ndarray:
    """uint64 whose ascending order is the preference order from the origin end (order-preserving
    bits of the float key; -0.0 is 0.0). NaN scores map to 0 and must be flagged unscored."""
    s = np.asarray(scores, dtype=np.float64)
    key = -s if (higher_is_better == (percentile_from == "best")) else s
    key = np.where(np.isnan(key), 0.0, key) + 0.0
    bits = key.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def key_records(ids: Sequence[str], n_tokens: np.ndarray, scores: np.ndarray | None, seed: int, salt: str,
                higher_is_better: bool = True, percentile_from: PercentileFrom = "best",
                eligible: np.ndarray | None = None) -> np.ndarray:
    """The per-document records selection works on (one chunk of a component, in row order)."""
    n = len(ids)
    rec = np.zeros(n, dtype=KEY_DTYPE)
    rec["tie"] = doc_hash_keys(ids, seed, salt)
    rec["mass"] = np.asarray(n_tokens, dtype=np.int64)
    flags = np.full(n, ELIGIBLE, dtype=np.uint8) if eligible is None else np.where(eligible, ELIGIBLE, 0).astype(np.uint8)
    if scores is not None:
        s = np.asarray(scores, dtype=np.float64)
        rec["key"] = order_key(s, higher_is_better, percentile_from)
        flags |= np.where(np.isfinite(s), SCORED, 0).astype(np.uint8)
    rec["flags"] = flags
    return rec


@dataclass(frozen=True)
class Cover:
    """The document holding a token position: its sort key, row, and the tokens before it."""

    key: int
    tie: int
    row: int
    prefix: int
    mass: int


Chunks = Callable[[], Iterator[np.ndarray]]   # a fresh pass over the KEY_DTYPE records, in row order


def _views(rec: np.ndarray, need: int, use_key: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ok = (rec["flags"] & need) == need
    key = rec["key"] if use_key else np.zeros(len(rec), dtype=np.uint64)
    return ok, key, rec["tie"]


def _bits(key: np.ndarray, tie: np.ndarray, level: int) -> np.ndarray:
    """The 16 bits at `level` (0 = the top) of the 128-bit composite key (key, tie)."""
    word, part = (key, level) if level < 4 else (tie, level - 4)
    return ((word >> np.uint64(48 - 16 * part)) & np.uint64(0xFFFF)).astype(np.int64)


def _prefix_match(key: np.ndarray, tie: np.ndarray, level: int, prefix: tuple[int, ...]) -> np.ndarray:
    m = np.ones(len(key), dtype=bool)
    for lv, v in enumerate(prefix[:level]):
        m &= _bits(key, tie, lv) == v
    return m


def locate(chunks: Chunks, positions: Sequence[int], need: int, use_key: bool) -> list[Cover | None]:
    """For each token position, the document holding it in the order (key, tie, row) among the
    documents with flags ⊇ `need` (None past the end). Histogram passes over the 128-bit key, 16
    bits at a time, narrow each position to one bucket until at most `CANDIDATES` documents are
    left, which are sorted exactly: memory is flat in the number of documents."""
    todo = {i: {"prefix": (), "base": 0} for i, p in enumerate(positions)}
    out: list[Cover | None] = [None] * len(positions)
    for level in range(9):
        if not todo:
            break
        final = {i for i, t in todo.items() if t.get("exact") or level == 8}
        hist = {i: (np.zeros(65536, np.int64), np.zeros(65536, np.int64)) for i in todo if i not in final}
        cands: dict[int, list[np.ndarray]] = {i: [] for i in final}
        row0 = 0
        for rec in chunks():
            ok, key, tie = _views(rec, need, use_key)
            for i, t in todo.items():
                m = ok & _prefix_match(key, tie, level if i not in final else len(t["prefix"]), t["prefix"])
                if i in final:
                    rows = np.flatnonzero(m)
                    c = np.zeros(len(rows), dtype=[("key", "<u8"), ("tie", "<u8"), ("row", "<i8"), ("mass", "<i8")])
                    c["key"], c["tie"], c["row"], c["mass"] = key[rows], tie[rows], rows + row0, rec["mass"][rows]
                    cands[i].append(c)
                else:
                    b = _bits(key[m], tie[m], level)
                    mass_h, count_h = hist[i]
                    mass_h += np.bincount(b, weights=rec["mass"][m], minlength=65536).astype(np.int64)
                    count_h += np.bincount(b, minlength=65536)
            row0 += len(rec)
        for i in final:
            c = np.concatenate(cands[i]) if cands[i] else np.zeros(0, dtype=[("key", "<u8"), ("tie", "<u8"),
                                                                             ("row", "<i8"), ("mass", "<i8")])
            c = c[np.lexsort((c["row"], c["tie"], c["key"]))]
            before = todo[i]["base"] + np.concatenate([[0], np.cumsum(c["mass"])[:-1]]).astype(np.int64)
            j = int(np.searchsorted(before + c["mass"], positions[i], side="right"))
            if j < len(c):
                out[i] = Cover(int(c["key"][j]), int(c["tie"][j]), int(c["row"][j]), int(before[j]), int(c["mass"][j]))
            del todo[i]
        for i, (mass_h, count_h) in hist.items():
            t = todo[i]
            ends = t["base"] + np.cumsum(mass_h)
            b = int(np.searchsorted(ends, positions[i], side="right"))
            if b >= 65536:          # past the end of the order
                out[i] = None
                del todo[i]
                continue
            t["base"] = int(ends[b] - mass_h[b])
            t["prefix"] = (*t["prefix"], b)
            t["exact"] = count_h[b] <= CANDIDATES
    return out


def _le(rec_key: np.ndarray, rec_tie: np.ndarray, rows: np.ndarray, c: Cover) -> np.ndarray:
    """(key, tie, row) <= c's, elementwise."""
    k, t = np.uint64(c.key), np.uint64(c.tie)
    return (rec_key < k) | ((rec_key == k) & ((rec_tie < t) | ((rec_tie == t) & (rows <= c.row))))


def in_slice(rec: np.ndarray, row0: int, bounds: "SliceBounds") -> np.ndarray:
    """Which documents of a chunk (rows row0...) belong to the slice."""
    ok, key, tie = _views(rec, bounds.need, bounds.use_key)
    rows = np.arange(row0, row0 + len(rec), dtype=np.int64)
    first, last = bounds.first, bounds.last
    after_first = ~_le(key, tie, rows, first) | ((key == np.uint64(first.key)) & (tie == np.uint64(first.tie))
                                                 & (rows == first.row))
    return ok & after_first & _le(key, tie, rows, last)


@dataclass(frozen=True)
class SliceBounds:
    """A slice as a closed range [first, last] of the order over the documents with `need` flags."""

    spec: SliceSpec
    first: Cover
    last: Cover
    need: int
    use_key: bool

    @property
    def n_tokens(self) -> int:
        return self.last.prefix + self.last.mass - self.first.prefix


def slice_bounds(decision: ComponentDecision, chunks: Chunks) -> list[SliceBounds]:
    """Where every slice of one component starts and ends in its order (two `locate` rounds:
    the band starts, then each start + target). Raises if two slices would overlap."""
    out: list[SliceBounds] = []
    for kind, need, use_key in (("quantile", ELIGIBLE | SCORED, True), ("random", ELIGIBLE, False)):
        specs = [s for s in decision.slices if s.kind == kind]
        if not specs:
            continue
        total = sum(int(r["mass"][(r["flags"] & need) == need].sum()) for r in chunks())
        if total == 0:
            raise ContractError(f"component '{decision.component}'", "no documents to slice (all excluded or unscored)")
        starts = []
        for s in specs:
            band = s.band if kind == "quantile" else (0.0, 1.0)
            # near the end the run is moved back so that it still holds the target
            starts.append(int(max(0, min(band[0] * total, total - s.target_tokens))))
        firsts = locate(chunks, starts, need, use_key)
        ends = [min(total, f.prefix + s.target_tokens) - 1 for f, s in zip(firsts, specs)]
        lasts = locate(chunks, ends, need, use_key)
        for s, f, last in zip(specs, firsts, lasts):
            out.append(SliceBounds(s, f, last, need, use_key))
    quantile = [b for b in out if b.use_key]
    for a, b in zip(quantile, quantile[1:]):
        if (b.first.key, b.first.tie, b.first.row) <= (a.last.key, a.last.tie, a.last.row):
            raise ContractError(f"component '{decision.component}'",
                                f"slice {b.spec.name} overlaps {a.spec.name}; lower slice_tokens")
    return out


@dataclass
class SliceSelection:
    """The documents of one slice: row indices into the component table, in row order."""

    spec: SliceSpec
    rows: np.ndarray
    n_tokens: int
    score_range: tuple[float, float] | None = None   # min/max score of the slice (quantile slices)


def select_slices(decision: ComponentDecision, ids: Sequence[str], n_tokens: np.ndarray,
                  scores: np.ndarray | None, eligible: np.ndarray | None = None) -> list[SliceSelection]:
    """Pick the documents of every slice of one component held in memory: the same function as
    the plan's streaming selection, over one chunk."""
    hib = next((s.higher_is_better for s in decision.slices), True)
    pf = next((s.percentile_from for s in decision.slices if s.percentile_from), "best")
    seed = next((s.seed for s in decision.slices), 0)
    rec = key_records(ids, n_tokens, scores, seed, decision.component, hib, pf, eligible)
    out = []
    for b in slice_bounds(decision, lambda: iter([rec])):
        rows = np.flatnonzero(in_slice(rec, 0, b))
        rng = None
        if b.use_key and scores is not None and len(rows):
            s = np.asarray(scores, dtype=np.float64)[rows]
            rng = (float(s.min()), float(s.max()))
        out.append(SliceSelection(b.spec, rows, int(np.asarray(n_tokens, dtype=np.int64)[rows].sum()), rng))
    return out


def component_is_scored(scored_tokens: int, total_tokens: int, rules: SliceRules) -> bool:
    return total_tokens > 0 and scored_tokens / total_tokens >= rules.min_scored_fraction and scored_tokens > 0


def describe_plan(decisions: list[ComponentDecision]) -> list[str]:
    """Human-readable lines, one per component and slice."""
    lines = []
    for d in decisions:
        lines.append(f"{d.component}: {d.rule} ({d.reason})")
        for s in d.slices:
            band = f" band {s.band[0]:.4f}-{s.band[1]:.4f}" if s.band else ""
            lines.append(f"  {s.name}: {s.target_tokens:,} tokens{band}")
    return lines
