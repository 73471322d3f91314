"""Scoring math for the four task formats, each with a standard error.

- Multiple choice by log-likelihood (lm-evaluation-harness / OLMES conventions): `acc` picks the
  choice with the highest summed log-probability; `acc_norm` divides by the choice's length in
  characters first (lm-eval's `acc_norm`), `acc_bytes` by its UTF-8 bytes; `prob_correct` is the probability mass on the gold choice after renormalizing over
  the choices (a continuous likelihood metric, which DataDecide finds more predictive for small
  proxies than accuracy).
- OLMES rule (Puro §4.1.2): a task with both a cloze (CF) and a lettered (MCF) form is scored
  both ways and the better of the two is reported, independently per model.
- pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k).
- Bits per byte: summed negative log-likelihood (nats) / ln 2 / UTF-8 bytes; its standard error
  by the delta method for a ratio of sums over documents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class Estimate:
    value: float
    stderr: float
    n: int

    def to_dict(self) -> dict:
        return {"value": self.value, "stderr": self.stderr, "n": self.n}


def mean_estimate(values: Sequence[float]) -> Estimate:
    """Sample mean and its standard error (ddof=1); stderr is NaN for fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        return Estimate(float("nan"), float("nan"), 0)
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return Estimate(float(x.mean()), se, n)


def ratio_estimate(numerators: Sequence[float], denominators: Sequence[float]) -> Estimate:
    """Σnum / Σden over items, with the delta-method standard error of a ratio of means."""
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    n = len(a)
    if n == 0 or b.sum() <= 0:
        return Estimate(float("nan"), float("nan"), n)
    r = a.sum() / b.sum()
    if n < 2:
        return Estimate(float(r), float("nan"), n)
    resid = a - r * b
    se = math.sqrt(float((resid ** 2).sum()) / (n * (n - 1))) / float(b.mean())
    return Estimate(float(r), se, n)


# ---- multiple choice -------------------------------------------------------------------------

def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value; ties go to the first (deterministic, as in lm-eval)."""
    return int(np.argmax(np.asarray(values, dtype=np.float64)))


def mc_item_scores(loglikelihoods: Sequence[float], choice_chars: Sequence[int], gold: int,
                   choice_bytes: Sequence[int] | None = None) -> dict[str, float]:
    """Per-item `acc`, `acc_norm` (log-likelihood per character of the choice, as lm-eval),
    `acc_bytes` (per UTF-8 byte, when the byte lengths are given) and `prob_correct`."""
    ll = np.asarray(loglikelihoods, dtype=np.float64)
    p = np.exp(ll - ll.max())
    p /= p.sum()
    out = {"acc": float(argmax_first(ll) == gold),
           "acc_norm": float(argmax_first(ll / np.asarray(choice_chars, dtype=np.float64)) == gold)}
    if choice_bytes is not None:
        out["acc_bytes"] = float(argmax_first(ll / np.asarray(choice_bytes, dtype=np.float64)) == gold)
    out["prob_correct"] = float(p[gold])
    return out


def olmes_best(form_scores: dict[str, Estimate]) -> tuple[str, Estimate]:
    """The better of the per-form scores (OLMES, Puro §4.1.2); ties go to the first form given."""
    best_name, best = None, None
    for name, est in form_scores.items():
        if best is None or (not math.isnan(est.value) and (math.isnan(best.value) or est.value > best.value)):
            best_name, best = name, est
    assert best_name is not None and best is not None
    return best_name, best


# ---- code ------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c pass (Chen et al. 2021, Eq. 1)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


# ---- bits per byte ---------------------------------------------------------------------------

LN2 = math.log(2.0)


def bits_per_byte(nll_nats: Sequence[float], n_bytes: Sequence[int]) -> Estimate:
    """Corpus bits per byte = Σ NLL / ln2 / Σ bytes, with a per-document delta-method stderr."""
    return ratio_estimate([x / LN2 for x in nll_nats], n_bytes)
