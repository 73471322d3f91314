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

Pure functions here decide plans and pick documents from arrays of per-document tokens and scores;
`select_component_slices` is the thin shell that reads a component.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.errors import ContractError

PercentileFrom = Literal["best", "worst"]
Anchor = Literal["start", "center"]


class SliceRules(BaseModel):
    """The numbers behind Puro's slice rules. Defaults are the paper's (Puro §3.6.1)."""

    model_config = ConfigDict(extra="forbid")
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


class SliceSpec(BaseModel):
    """One slice to evaluate. `band` is the token-mass interval in the component's preference
    order, best first: [0, 0.01) is the best-scored 1% of tokens."""

    model_config = ConfigDict(extra="forbid")
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


class ComponentDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")
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

def doc_hash_keys(ids: Sequence[str], seed: int, salt: str = "") -> np.ndarray:
    """A seeded pseudo-random uint64 per document id: order-free and the same on any machine."""
    out = np.empty(len(ids), dtype=np.uint64)
    prefix = f"{seed}\x1f{salt}\x1f".encode("utf-8")
    for i, doc_id in enumerate(ids):
        out[i] = int.from_bytes(hashlib.blake2b(prefix + str(doc_id).encode("utf-8"), digest_size=8).digest(), "little")
    return out


def preference_order(scores: np.ndarray, tie_keys: np.ndarray, higher_is_better: bool,
                     percentile_from: PercentileFrom) -> np.ndarray:
    """Indices of the scored documents from the origin end: best first when `percentile_from` is
    'best'. Ties are broken by the seeded hash key, so the order does not depend on input order.
    Documents without a score (NaN) are left out."""
    scores = np.asarray(scores, dtype=np.float64)
    valid = np.flatnonzero(~np.isnan(scores))
    s = scores[valid]
    best_first = (percentile_from == "best")
    key = -s if (higher_is_better == best_first) else s
    order = np.lexsort((tie_keys[valid], key))
    return valid[order]


def take_contiguous(tokens_in_order: np.ndarray, start_tokens: float, target_tokens: int) -> tuple[int, int]:
    """Positions [i0, i1) of a run of documents that starts at token offset `start_tokens` and holds
    at least `target_tokens` (fewer only if the component is smaller): the total is within one
    document of the target. Near the end the run is moved back so it is still full."""
    n = len(tokens_in_order)
    if n == 0:
        return (0, 0)
    cum = np.concatenate([[0], np.cumsum(tokens_in_order, dtype=np.int64)])
    total = int(cum[-1])
    if target_tokens >= total:
        return (0, n)
    i0 = int(np.searchsorted(cum, start_tokens, side="left"))
    i0 = min(i0, n - 1)
    i1 = int(np.searchsorted(cum, cum[i0] + target_tokens, side="left"))
    if i1 > n:  # ran off the end: take the last documents instead
        i1 = n
        i0 = int(np.searchsorted(cum, total - target_tokens, side="right")) - 1
        i0 = max(i0, 0)
    return (i0, i1)


@dataclass
class SliceSelection:
    """The documents of one slice: row indices into the component table, in preference order."""

    spec: SliceSpec
    rows: np.ndarray
    n_tokens: int
    score_range: tuple[float, float] | None = None   # min/max score of the slice (quantile slices)


def select_slices(decision: ComponentDecision, ids: Sequence[str], n_tokens: np.ndarray,
                  scores: np.ndarray | None) -> list[SliceSelection]:
    """Pick the documents of every slice of one component. Quantile slices are contiguous runs of
    the preference order at their bands; the random slice is a prefix of a seeded hash order.
    Raises if two quantile slices would share a document."""
    n_tokens = np.asarray(n_tokens, dtype=np.int64)
    out: list[SliceSelection] = []
    for spec in decision.slices:
        keys = doc_hash_keys(ids, spec.seed, salt=decision.component)
        if spec.kind == "random":
            order = np.argsort(keys, kind="stable")
            i0, i1 = take_contiguous(n_tokens[order], 0, spec.target_tokens)
            rows = order[i0:i1]
            out.append(SliceSelection(spec, rows, int(n_tokens[rows].sum())))
            continue
        assert scores is not None and spec.band is not None and spec.percentile_from is not None
        order = preference_order(scores, keys, spec.higher_is_better, spec.percentile_from)
        toks = n_tokens[order]
        start = spec.band[0] * float(toks.sum())
        i0, i1 = take_contiguous(toks, start, spec.target_tokens)
        rows = order[i0:i1]
        s = np.asarray(scores, dtype=np.float64)[rows]
        out.append(SliceSelection(spec, rows, int(n_tokens[rows].sum()),
                                  (float(s.min()), float(s.max())) if len(s) else None))
    seen: set[int] = set()
    for sel in out:
        rows = set(int(r) for r in sel.rows)
        if seen & rows:
            raise ContractError(f"component '{decision.component}'",
                                f"slice {sel.spec.name} overlaps an earlier slice ({len(seen & rows)} shared documents); "
                                "lower slice_tokens")
        seen |= rows
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
