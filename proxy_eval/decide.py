"""Decisions from a proxy experiment: within-source thresholds from quantile slices, then a
mixture suggestion over the retained components, written as a `mixture/1` spec draft.

The shell around `proxy_eval.thresholds` and `proxy_eval.suggest`: it reads the slice plan (which
slice belongs to which component, at which percentile) and the profile (group scores, averages,
standard errors).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from purokit.component import Component
from mixtures.spec import parse_spec
from proxy_eval.plan import SlicePlan
from proxy_eval.profiles import Profile
from proxy_eval.suggest import capacity_caps, mixture_spec_draft, suggest_mixture
from proxy_eval.thresholds import QuantileSlice, select_threshold


def slice_average_stderr(profile: Profile, slice_name: str) -> float:
    """Standard error of a slice's average over benchmarks (independent benchmarks)."""
    rows = profile.long[profile.long["slice"] == slice_name]
    se = [float(x) for x in rows["score_stderr"] if x is not None and not math.isnan(float(x))]
    if not se:
        return float("nan")
    return math.sqrt(sum(x * x for x in se)) / len(rows)


def component_paths(plan: SlicePlan) -> dict[str, str]:
    out = {}
    for ref in plan.config.get("components", []):
        name = ref.get("name") or Component.open(ref["path"]).name
        out[name] = str(Path(ref["path"]).resolve())
    return out


def suggest_from_plan(profile: Profile, plan_dir: str | Path, emphasis: dict[str, float] | None = None,
                      temperature: float = 1.0, budget_tokens: int | None = None, max_epochs: float = 1.0,
                      tolerance: float = 0.5, exclude: set[str] | None = None, base_spec: dict[str, Any] | None = None,
                      name: str = "proxy-suggestion") -> dict[str, Any]:
    plan = SlicePlan.load(plan_dir)
    exclude = exclude or set()
    by_name = {s.name: s for s in plan.slices}
    decisions = {d.component: d for d in plan.decisions}
    present = [r for r in profile.groups.index if r not in exclude]
    notes = [f"profile row {r!r} is not a slice of this plan; left out" for r in present if r not in by_name]
    present = [r for r in present if r in by_name]
    if not present:
        raise ValueError(f"no profiled slice belongs to the plan in {plan_dir}")

    thresholds: dict[str, dict[str, Any]] = {}
    runs_used: list[str] = []
    retained: dict[str, int] = {}
    retention: dict[str, dict[str, Any]] = {}
    for comp in sorted({by_name[r].component for r in present}):
        mine = [by_name[r] for r in present if by_name[r].component == comp]
        quant = sorted((s for s in mine if s.kind == "quantile"), key=lambda s: s.percentile or 0.0)
        total = decisions[comp].n_tokens
        if quant:
            qs = [QuantileSlice(float(s.percentile or 0.0), float(profile.average[s.name]),
                                slice_average_stderr(profile, s.name), s.name) for s in quant]
            d = select_threshold(qs, total, None, tolerance=tolerance)
            thresholds[comp] = d.to_dict()
            runs_used += d.paying
            retained[comp] = d.keep_tokens
            if d.keep_fraction < 1.0:
                retention[comp] = {"rule": "top_fraction", "fraction": round(d.keep_fraction, 6)}
        else:
            runs_used += [s.name for s in mine]
            retained[comp] = total
    runs = {r: {g: float(profile.groups.loc[r, g]) for g in profile.groups.columns} for r in runs_used}
    mixtures = {r: {by_name[r].component: 1.0} for r in runs_used}
    prior = {c: n / sum(retained.values()) for c, n in retained.items()}
    caps = capacity_caps(retained, budget_tokens, max_epochs) if budget_tokens else None
    suggestion = suggest_mixture(runs, mixtures, emphasis=emphasis, temperature=temperature, prior=prior,
                                 max_weight=caps)
    suggestion.notes.extend(notes)
    paths = component_paths(plan)
    comps: dict[str, dict[str, Any]] = {}
    for c in suggestion.components:
        field = next((s.score_field for s in plan.slices if s.component == c and s.score_field), None)
        hib = next((sl.higher_is_better for d in plan.decisions if d.component == c for sl in d.slices), True)
        comps[c] = {"path": paths[c], "score_field": field, "higher_is_better": hib,
                    "retention": retention.get(c, {"rule": "all"})}
    base = dict(base_spec or {})
    if "tokenizer" not in base or "seq_len" not in base:
        suggestion.notes.append("fill in tokenizer and seq_len (pass --base-spec) before materializing")
    text = mixture_spec_draft(suggestion, comps, base=base, name=name)
    valid, problem = None, None
    if "tokenizer" in base and "seq_len" in base:
        try:
            parse_spec(yaml.safe_load(text), source="<draft>")
            valid = True
        except ValueError as e:       # MixtureSpecError is a ContractError (a ValueError)
            valid, problem = False, str(e)
    return {"thresholds": thresholds, "suggestion": suggestion.to_dict(), "runs_used": runs_used,
            "retained_tokens": retained, "spec_valid": valid, "spec_problem": problem, "spec_yaml": text}
