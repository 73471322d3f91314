"""Mixture suggestion: regression over profiles and the tilted-weights optimum."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from proxy_eval.suggest import (capacity_caps, fit_contributions, mixture_spec_draft, round_weights,
                                slices_to_mixtures, suggest_mixture, tilted_weights)
from tests.proxy_eval.test_analysis import FIXTURE, GROUPS

COMPONENT = {"S01_web_hi": "web", "S02_web_mid": "web", "S03_web_lo": "web", "S04_math_web": "math",
             "S05_math_syn": "math", "S06_code": "code", "S07_code_doc": "code", "S08_zh_edu": "zh"}
RUNS = {s: dict(zip(GROUPS, v)) for s, v in FIXTURE.items()}


def test_emphasis_moves_weight_to_the_matching_source():
    mix = slices_to_mixtures(COMPONENT)
    math_first = suggest_mixture(RUNS, mix, emphasis={"Math": 1.0})
    code_first = suggest_mixture(RUNS, mix, emphasis={"Code": 1.0})
    zh_first = suggest_mixture(RUNS, mix, emphasis={"Chinese": 1.0})
    assert max(math_first.weights, key=math_first.weights.get) == "math"
    assert max(code_first.weights, key=code_first.weights.get) == "code"
    assert max(zh_first.weights, key=zh_first.weights.get) == "zh"
    for s in (math_first, code_first, zh_first):
        assert sum(s.weights.values()) == pytest.approx(1.0)
        assert all(w > 0 for w in s.weights.values())      # the temperature keeps breadth
    # the prediction moves the emphasized capability up
    assert math_first.predicted["Math"] > code_first.predicted["Math"]
    # with one-hot runs, a component's contribution is about the mean of its slices
    beta_code = code_first.coefficients["Code"]["code"]
    z = (np.array([24.0, 20.0]) - np.mean([v[2] for v in FIXTURE.values()])) / np.std([v[2] for v in FIXTURE.values()])
    assert beta_code == pytest.approx(z.mean(), abs=1e-2)


def test_temperature_limits_and_bounds():
    mix = slices_to_mixtures(COMPONENT)
    prior = {"web": 0.7, "math": 0.1, "code": 0.1, "zh": 0.1}
    hot = suggest_mixture(RUNS, mix, emphasis={"Math": 1}, temperature=1e9, prior=prior)
    assert hot.weights == pytest.approx(prior, abs=1e-6)
    cold = suggest_mixture(RUNS, mix, emphasis={"Math": 1}, temperature=1e-3)
    assert cold.weights["math"] == pytest.approx(1.0, abs=1e-6)
    capped = suggest_mixture(RUNS, mix, emphasis={"Math": 1}, temperature=1e-3,
                             max_weight={"math": 0.3}, min_weight={"zh": 0.05})
    assert capped.weights["math"] == pytest.approx(0.3)
    assert capped.weights["zh"] >= 0.05 - 1e-12
    assert sum(capped.weights.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="caps"):
        tilted_weights(np.zeros(2), np.ones(2) / 2, 1.0, np.zeros(2), np.array([0.3, 0.3]))


def test_regression_recovers_contributions_from_mixture_runs():
    rng = np.random.default_rng(0)
    beta = rng.normal(size=(4, 3))
    W = rng.dirichlet(np.ones(4), size=40)
    Y = W @ beta
    assert fit_contributions(W, Y, ridge=1e-9) == pytest.approx(beta, abs=1e-5)


def test_capacity_caps_and_rounding():
    assert capacity_caps({"a": 50, "b": 500}, budget_tokens=100, max_epochs=1) == {"a": 0.5, "b": 1.0}
    r = round_weights({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 4)
    assert sum(r.values()) == pytest.approx(1.0, abs=1e-12) and sorted(r.values()) == [0.3333, 0.3333, 0.3334]


def test_mixture_spec_draft_is_reviewable_yaml():
    s = suggest_mixture(RUNS, slices_to_mixtures(COMPONENT), emphasis={"Math": 0.5, "General": 0.5, "Music": 1})
    assert any("Music" in n for n in s.notes)
    comps = {c: {"path": f"/data/{c}"} for c in s.components}
    comps["web"].update(score_field="quality.hq", retention={"rule": "top_fraction", "fraction": 0.05})
    text = mixture_spec_draft(s, comps, base={"seq_len": 512})
    assert text.startswith("# DRAFT")
    spec = yaml.safe_load(text)
    assert spec["schema"] == "mixture/1" and spec["seq_len"] == 512
    weights = spec["phases"][0]["components"]
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-12)
    web = next(c for c in spec["components"] if c["name"] == "web")
    assert web["retention"] == {"rule": "top_fraction", "fraction": 0.05} and web["higher_is_better"] is True


def _objective(w, u, p, tau):
    w = np.maximum(w, 1e-300)
    return float(w @ u - tau * np.sum(np.where(w > 1e-300, w * np.log(w / p), 0.0)))


def test_tilted_weights_is_the_projection_when_floors_and_caps_both_bind():
    w = tilted_weights(np.log([10.0, 1, 1]), np.ones(3) / 3, 1.0, np.array([0, .45, .45]), np.array([.5, 1, 1]))
    assert w == pytest.approx([0.10, 0.45, 0.45], abs=1e-12)
    # every component fixed at a bound: no division by zero
    assert tilted_weights(np.zeros(2), np.ones(2) / 2, 1.0, np.array([.5, .5]), np.ones(2)) == pytest.approx([.5, .5])
    assert tilted_weights(np.zeros(2), np.ones(2) / 2, 1.0, np.zeros(2), np.array([.5, .5])) == pytest.approx([.5, .5])


def test_tilted_weights_properties_on_random_floors_and_caps():
    """Seeded property test: feasible, KKT-optimal (w = clip(t·prior·exp(u/τ), floor, cap) for one
    t), and no random move along the simplex that stays within the bounds is better."""
    rng = np.random.default_rng(1234)
    for trial in range(300):
        n = int(rng.integers(1, 8))
        u = rng.normal(scale=3.0, size=n)
        p = rng.dirichlet(np.ones(n))
        tau = float(10 ** rng.uniform(-2, 1))
        lo = rng.dirichlet(np.ones(n)) * rng.uniform(0, 1) * (rng.random(n) < 0.6)
        hi = np.maximum(lo, np.minimum(1.0, lo + rng.uniform(0, 1, size=n) * (rng.random(n) < 0.6) + (rng.random(n) >= 0.6)))
        if hi.sum() < 1:
            hi = np.minimum(1.0, hi + (1 - hi.sum()) / n + 1e-9)
            hi = np.maximum(hi, lo)
            if hi.sum() < 1:
                continue
        w = tilted_weights(u, p, tau, lo, hi)
        assert w.sum() == pytest.approx(1.0, abs=1e-9), trial
        assert np.all(w >= lo - 1e-12) and np.all(w <= hi + 1e-12), trial
        logb = np.log(p) + u / tau
        free = (w > lo + 1e-9) & (w < hi - 1e-9)
        if free.any():   # w = clip(t·b, lo, hi) for the one t the free components share
            log_t = np.log(w[free]) - logb[free]
            assert np.allclose(log_t, log_t.mean(), atol=1e-6), trial
            with np.errstate(over="ignore"):
                assert w == pytest.approx(np.clip(np.exp(log_t.mean() + logb), lo, hi), abs=1e-9), trial
        best = _objective(w, u, p, tau)
        for _ in range(20):   # moves along the simplex that stay in the box never improve
            i, j = rng.choice(n, size=2, replace=True)
            step = min(w[i] - lo[i], hi[j] - w[j]) * rng.random()
            if i == j or step <= 0:
                continue
            v = w.copy()
            v[i] -= step
            v[j] += step
            assert _objective(v, u, p, tau) <= best + 1e-9, trial
