"""Within-source threshold selection from quantile slices (Puro §3.6.1, "Fine-grained data slice
selection"): compare the proxy profiles of slices taken at different score ranges and keep the
region where quality still pays.

Rule: walk the quantile slices from the best end (q00, q25, ...). A slice still "pays" while its
score is within `tolerance` points (or `z` standard errors of the difference, whichever is larger)
of the best end's. Quality stops paying between the last slice that pays and the first that does
not; the cut is placed midway between their percentile positions. The kept fraction is then capped
by the token budget. DCLM-Dedup in the paper: q00 ranks 3rd and q25 11th, so only the top region
pays; with a 34B budget out of ~680B, the top 5% is kept (behaviour 19).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class QuantileSlice:
    percentile: float          # position from the best end, 0..100
    score: float               # the slice's proxy score (higher is better), e.g. its profile average
    stderr: float = float("nan")
    name: str = ""


@dataclass(frozen=True)
class ThresholdDecision:
    keep_fraction: float                  # of the component's tokens, from the best end
    quality_cut_fraction: float           # where quality stops paying (1.0: it never stops)
    budget_fraction: float | None         # budget / component tokens (None: no budget)
    keep_tokens: int
    paying: list[str]                     # slices that pay
    not_paying: list[str]
    limited_by: str                       # "quality" | "budget" | "none"
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def select_threshold(slices: Sequence[QuantileSlice], component_tokens: int, budget_tokens: int | None = None,
                     tolerance: float = 0.5, z: float = 1.0) -> ThresholdDecision:
    """Decide how much of a scored component to keep, from the best end (see module docstring)."""
    if not slices:
        raise ValueError("threshold selection needs at least one quantile slice")
    ordered = sorted(slices, key=lambda s: s.percentile)
    best = ordered[0]
    paying = [best]
    failing: QuantileSlice | None = None
    for s in ordered[1:]:
        se = math.sqrt(sum(x ** 2 for x in (s.stderr, best.stderr) if not math.isnan(x)))
        allowed = max(tolerance, z * se)
        if best.score - s.score <= allowed:
            paying.append(s)
        else:
            failing = s
            break
    if failing is None:
        cut = 1.0
        why = f"all {len(ordered)} quantile slices score within the tolerance of the best end"
    else:
        last = paying[-1]
        cut = (last.percentile + failing.percentile) / 200.0
        why = (f"{failing.name or f'q{failing.percentile:g}'} scores {best.score - failing.score:.2f} below the best end "
               f"(allowed {max(tolerance, z * math.sqrt(sum(x ** 2 for x in (failing.stderr, best.stderr) if not math.isnan(x)))):.2f}); "
               f"quality stops paying between the {last.percentile:g}th and {failing.percentile:g}th percentile")
    budget_frac = None if budget_tokens is None else min(1.0, budget_tokens / component_tokens)
    keep = cut if budget_frac is None else min(cut, budget_frac)
    limited = "none" if keep >= 1.0 else ("budget" if budget_frac is not None and budget_frac < cut else "quality")
    if limited == "budget":
        why += f"; the budget of {budget_tokens:,} tokens keeps the top {100 * keep:.3g}%"
    remaining = [s for s in ordered if s not in paying]
    return ThresholdDecision(
        keep_fraction=keep, quality_cut_fraction=cut, budget_fraction=budget_frac,
        keep_tokens=int(round(keep * component_tokens)), paying=[s.name or f"q{s.percentile:g}" for s in paying],
        not_paying=[s.name or f"q{s.percentile:g}" for s in remaining], limited_by=limited, reason=why)


def score_at_fraction(scores: np.ndarray, n_tokens: np.ndarray, keep_fraction: float,
                      higher_is_better: bool = True) -> float:
    """The score threshold that keeps `keep_fraction` of the tokens from the best end: documents
    scoring at least this (at most, when lower is better) hold about that share of the tokens."""
    s = np.asarray(scores, dtype=np.float64)
    t = np.asarray(n_tokens, dtype=np.float64)
    ok = ~np.isnan(s)
    s, t = s[ok], t[ok]
    if len(s) == 0:
        raise ValueError("no scored documents")
    order = np.argsort(-s if higher_is_better else s, kind="stable")
    cum = np.cumsum(t[order]) / t.sum()
    i = int(np.searchsorted(cum, min(max(keep_fraction, 0.0), 1.0) - 1e-12, side="left"))
    return float(s[order][min(i, len(s) - 1)])
