"""Mixture suggestion: component weights from capability profiles, as a mixture-spec draft.

Puro sets its mixture by hand from the proxy profiles (§3.6.1: "we take heuristics from these
capability profiles and still choose the concrete mixing ratios manually"). This module makes that
heuristic explicit and reviewable, in the spirit of RegMix (Liu et al., ICLR 2025: regress a target
on mixture weights over many small runs, then optimize the mixture):

1. Every proxy run r has a mixture w_r over components (a slice of one component is one-hot) and a
   capability vector y_r (group scores). Each group is z-scored across runs, so the emphasis
   weights compare like with like.
2. Per group g, a ridge regression y_g ≈ W β_g (no intercept; the rows of W sum to 1) gives each
   component's contribution β_{g,c}. With one-hot runs, β_{g,c} is (almost) the mean of c's runs;
   runs on real mixtures refine it, as in RegMix.
3. A target emphasis e (e.g. Math 0.5, Code 0.3, General 0.2) scores components by
   u_c = Σ_g e_g β_{g,c}. Maximizing Σ_c w_c u_c − τ·KL(w ‖ prior) over the simplex gives
   w_c ∝ prior_c · exp(u_c / τ): the linear optimum alone would put everything on one source; τ
   (the temperature, in z units) keeps breadth, and the prior (e.g. the natural token shares) is
   what τ → ∞ returns.
4. Bounds per component (a floor for coverage; a cap from available tokens × allowed epochs over
   the budget) make it a projection onto {floor ≤ w ≤ cap, Σ w = 1}: the optimum is
   clip(t · prior · exp(u/τ), floor, cap) for the one t that makes the weights sum to 1.

The result is written as a mixture spec draft (`mixture/1`) with the threshold decisions as
retention rules and a header saying it is a draft for a person to review.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import yaml


@dataclass
class Suggestion:
    components: list[str]
    groups: list[str]
    weights: dict[str, float]
    utility: dict[str, float]                          # u_c in z units
    coefficients: dict[str, dict[str, float]]          # group -> component -> beta (z units)
    predicted_z: dict[str, float]                      # group -> predicted z-score of the mixture
    predicted: dict[str, float]                        # group -> predicted score (original units)
    emphasis: dict[str, float]
    temperature: float
    fit_rmse_z: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("components", "groups", "weights", "utility", "coefficients",
                                               "predicted_z", "predicted", "emphasis", "temperature", "fit_rmse_z",
                                               "notes")}


def fit_contributions(W: np.ndarray, Y: np.ndarray, ridge: float = 1e-3) -> np.ndarray:
    """β (components × groups) minimizing ‖Wβ − Y‖² + ridge·‖β‖² (closed form)."""
    k = W.shape[1]
    return np.linalg.solve(W.T @ W + ridge * np.eye(k), W.T @ Y)


def tilted_weights(utility: np.ndarray, prior: np.ndarray, temperature: float,
                   lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """argmax_w Σ w u − τ KL(w‖prior) over {lower ≤ w ≤ upper, Σ w = 1}, exactly.

    The objective is separable and strictly concave, so the KKT conditions give the optimum up to
    one scalar: w_c(t) = clip(t · b_c, lower_c, upper_c) with b_c = prior_c · exp(u_c / τ) and t > 0
    the multiplier of Σ w = 1. S(t) = Σ_c w_c(t) is nondecreasing and linear between the
    breakpoints lower_c / b_c and upper_c / b_c; on the segment where S crosses 1 the components
    inside their bounds share what the bounded ones leave in proportion to b_c. Everything is in
    log space, so a cold temperature (b_c underflowing) still gives the exact projection.
    Components with prior 0 stay at their floor.
    """
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    prior = np.asarray(prior, dtype=np.float64)
    if np.any(lower > upper):
        raise ValueError(f"a weight floor exceeds its cap: floors {lower.tolist()}, caps {upper.tolist()}")
    if lower.sum() > 1 + 1e-9:
        raise ValueError(f"the weight floors sum to {lower.sum():.4g} > 1")
    if upper.sum() < 1 - 1e-9:
        raise ValueError(f"the weight caps sum to {upper.sum():.4g} < 1: not enough data for the budget")
    with np.errstate(divide="ignore", over="ignore"):
        logb = np.where(prior > 0, np.log(np.where(prior > 0, prior, 1.0)), -np.inf) \
            + np.asarray(utility, dtype=np.float64) / max(temperature, 1e-12)
        pos = np.isfinite(logb)
        breaks = np.concatenate([np.log(lower[pos & (lower > 0)]) - logb[pos & (lower > 0)],
                                 np.log(upper[pos & (upper > 0)]) - logb[pos & (upper > 0)]])
        breaks = np.unique(breaks[np.isfinite(breaks)])

        def at(log_t: float) -> np.ndarray:
            return np.clip(np.exp(log_t + logb), lower, upper)

        k = int(np.searchsorted([at(x).sum() for x in breaks], 1.0, side="left"))
        if len(breaks) == 0:
            mid = 0.0
        elif k == 0:
            mid = breaks[0] - 1.0
        elif k == len(breaks):
            mid = breaks[-1] + 1.0
        else:
            mid = 0.5 * (breaks[k - 1] + breaks[k])
        w = at(mid)
        log_w = mid + logb      # classify in log space: the free values may underflow at `mid`
        free = pos & (log_w > np.log(lower)) & (log_w < np.log(upper))
    if not free.any():
        if abs(w.sum() - 1.0) > 1e-9:
            raise ValueError(f"no weights within the floors and caps sum to 1 (components with prior 0 keep "
                             f"their floor): floors {lower.tolist()}, caps {upper.tolist()}")
        return w
    rest = 1.0 - w[~free].sum()
    z = np.exp(logb[free] - logb[free].max())
    w[free] = rest * z / z.sum()
    return w


def suggest_mixture(runs: Mapping[str, Mapping[str, float]], run_mixtures: Mapping[str, Mapping[str, float]],
                    emphasis: Mapping[str, float] | None = None, temperature: float = 1.0,
                    prior: Mapping[str, float] | None = None, min_weight: Mapping[str, float] | None = None,
                    max_weight: Mapping[str, float] | None = None, ridge: float = 1e-3) -> Suggestion:
    """`runs`: run -> {group: score}; `run_mixtures`: run -> {component: weight} (one-hot for a
    slice). `emphasis`: group -> weight (default: equal). `prior`: component -> weight (default:
    uniform). Bounds are per component."""
    names = sorted(runs)
    missing = [r for r in names if r not in run_mixtures]
    if missing:
        raise ValueError(f"runs without a mixture: {missing}")
    groups = sorted({g for r in names for g in runs[r]})
    components = sorted({c for r in names for c in run_mixtures[r]})
    Y = np.array([[float(runs[r].get(g, np.nan)) for g in groups] for r in names])
    if np.isnan(Y).any():
        raise ValueError("every run needs a score for every group")
    W = np.array([[float(run_mixtures[r].get(c, 0.0)) for c in components] for r in names])
    W = W / W.sum(axis=1, keepdims=True)
    mu, sd = Y.mean(axis=0), Y.std(axis=0)
    sd_safe = np.where(sd > 1e-12, sd, 1.0)
    Z = (Y - mu) / sd_safe
    beta = fit_contributions(W, Z, ridge)                             # components × groups
    fit_rmse = float(np.sqrt(np.mean((W @ beta - Z) ** 2)))
    emph = {g: 1.0 for g in groups} if emphasis is None else {g: float(emphasis.get(g, 0.0)) for g in groups}
    unknown = sorted(set(emphasis or {}) - set(groups))
    total = sum(emph.values())
    if total <= 0:
        raise ValueError(f"the emphasis puts no weight on any profiled group ({groups})")
    e = np.array([emph[g] / total for g in groups])
    u = beta @ e
    p = np.array([float((prior or {}).get(c, 1.0)) for c in components])
    p = p / p.sum()
    lo = np.array([float((min_weight or {}).get(c, 0.0)) for c in components])
    hi = np.array([float((max_weight or {}).get(c, 1.0)) for c in components])
    w = tilted_weights(u, p, temperature, lo, hi)
    zhat = w @ beta
    notes = [f"emphasis names groups that were not profiled: {unknown}"] if unknown else []
    flat = [groups[j] for j in range(len(groups)) if sd[j] <= 1e-12]
    if flat:
        notes.append(f"groups with no spread across runs carry no signal: {flat}")
    return Suggestion(
        components=components, groups=groups,
        weights={c: float(x) for c, x in zip(components, w)},
        utility={c: float(x) for c, x in zip(components, u)},
        coefficients={g: {c: float(beta[i, j]) for i, c in enumerate(components)} for j, g in enumerate(groups)},
        predicted_z={g: float(zhat[j]) for j, g in enumerate(groups)},
        predicted={g: float(mu[j] + sd[j] * zhat[j]) for j, g in enumerate(groups)},
        emphasis={g: float(x) for g, x in zip(groups, e)}, temperature=temperature, fit_rmse_z=fit_rmse, notes=notes)


def capacity_caps(available_tokens: Mapping[str, int], budget_tokens: int, max_epochs: float = 1.0) -> dict[str, float]:
    """w_c ≤ available_c · epochs / budget: no component is repeated more than allowed."""
    return {c: min(1.0, n * max_epochs / budget_tokens) for c, n in available_tokens.items()}


def round_weights(weights: Mapping[str, float], decimals: int = 4) -> dict[str, float]:
    """Round so that the rounded weights still sum to exactly 1 (largest remainder)."""
    unit = 10 ** decimals
    raw = {c: w * unit for c, w in weights.items()}
    floor = {c: math.floor(v) for c, v in raw.items()}
    short = unit - sum(floor.values())
    for c in sorted(raw, key=lambda c: (-(raw[c] - floor[c]), c))[:short]:
        floor[c] += 1
    return {c: v / unit for c, v in floor.items()}


def mixture_spec_draft(suggestion: Suggestion, components: Mapping[str, Mapping[str, Any]],
                       base: Mapping[str, Any] | None = None, name: str = "proxy-suggestion",
                       phase: str = "main") -> str:
    """YAML text of a `mixture/1` spec draft. `components`: name -> {path, score_field,
    higher_is_better, retention (a retention-rule dict)}; `base`: fields to include as given
    (tokenizer, seq_len, seeds, bucket_count, ...)."""
    comps = []
    for c in suggestion.components:
        info = dict(components.get(c, {}))
        if "path" not in info:
            raise ValueError(f"no path for component {c!r}")
        entry: dict[str, Any] = {"name": c, "path": str(info["path"])}
        if info.get("score_field"):
            entry["score_field"] = info["score_field"]
            entry["higher_is_better"] = bool(info.get("higher_is_better", True))
        entry["retention"] = info.get("retention") or {"rule": "all"}
        comps.append(entry)
    spec: dict[str, Any] = {"schema": "mixture/1", "name": name}
    spec.update(dict(base or {}))
    spec["components"] = comps
    spec["phases"] = [{"name": phase, "orders": ["uniform"], "components": round_weights(suggestion.weights)}]
    emph = ", ".join(f"{g} {w:.2f}" for g, w in suggestion.emphasis.items())
    header = [
        "# DRAFT mixture spec written by `python -m proxy_eval suggest`: review before use.",
        f"# Weights ∝ prior · exp(u / {suggestion.temperature:g}), u = emphasis-weighted z-scored contributions",
        f"# (emphasis: {emph}); ridge fit RMSE over proxy runs {suggestion.fit_rmse_z:.3f} z.",
        "# Predicted group scores of this mixture: "
        + ", ".join(f"{g} {v:.3g}" for g, v in suggestion.predicted.items()),
    ] + [f"# note: {n}" for n in suggestion.notes]
    return "\n".join(header) + "\n" + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)


def slices_to_mixtures(slice_components: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """One-hot mixtures for single-component slice runs."""
    return {s: {c: 1.0} for s, c in slice_components.items()}
