"""Profiles (behaviour 17), the PCA fixture (seed-puro.md §3.7, behaviour 18), threshold selection
(behaviour 19) and the fits (behaviours 30 and 33)."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from proxy_eval.fits import (Curve, MPLParams, cost_law, fit_cost_law, fit_mpl, fit_power_law, invert_cost_law,
                             mpl_loss)
from proxy_eval.pca import biplot, capability_pca
from proxy_eval.profiles import build_profile, read_profile
from proxy_eval.thresholds import QuantileSlice, score_at_fraction, select_threshold

FIXTURE = {  # seed-puro.md §3.7 (synthetic, not from the paper)
    "S01_web_hi": (52.0, 20.0, 8.0, 30.0), "S02_web_mid": (49.5, 17.0, 9.0, 29.0),
    "S03_web_lo": (46.0, 15.5, 10.0, 28.5), "S04_math_web": (50.0, 34.0, 10.5, 29.5),
    "S05_math_syn": (45.0, 38.0, 12.0, 28.0), "S06_code": (41.0, 21.0, 24.0, 28.0),
    "S07_code_doc": (43.5, 18.0, 20.0, 28.5), "S08_zh_edu": (44.0, 16.0, 9.5, 45.0),
}
GROUPS = ["General", "Math", "Code", "Chinese"]


def test_pca_fixture_reproduces_expected_numbers(tmp_path):
    rows = list(FIXTURE)
    res = capability_pca(np.array([FIXTURE[r] for r in rows]), rows, GROUPS)
    assert res.explained_variance_ratio.sum() == pytest.approx(1.0, abs=1e-12)
    assert res.explained_variance_ratio == pytest.approx([0.448, 0.344, 0.180, 0.028], abs=1e-3)
    expected = {"General": (0.686, 0.183), "Math": (0.100, 0.644), "Code": (-0.712, 0.153), "Chinese": (0.111, -0.727)}
    for v, (pc1, pc2) in expected.items():
        assert res.loading(v, 0) == pytest.approx(pc1, abs=1e-3)
        assert res.loading(v, 1) == pytest.approx(pc2, abs=1e-3)
    # the qualitative Figure-20 reading
    assert res.loading("General", 0) > 0.5 and res.loading("Code", 0) < -0.5
    assert abs(res.loading("Math", 1)) > abs(res.loading("Math", 0)) and res.loading("Math", 0) > 0
    vec = {v: res.loadings[res.variables.index(v), :2] for v in GROUPS}
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert cos(vec["General"], vec["Code"]) < cos(vec["General"], vec["Math"])
    # signs are canonical: flipping the input rows' order or negating nothing changes them
    rev = capability_pca(np.array([FIXTURE[r] for r in rows[::-1]]), rows[::-1], GROUPS)
    assert np.allclose(rev.loadings, res.loadings)
    png = biplot(res, tmp_path / "biplot.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_pca_sign_fallback_and_constant_columns():
    x = np.array([[1.0, 2.0, 5.0], [2.0, 1.0, 5.0], [3.0, 0.5, 5.0]])
    res = capability_pca(x, ["a", "b", "c"], ["p", "q", "k"], sign_anchors=None)
    assert res.dropped == ["k"]
    j = int(np.argmax(np.abs(res.loadings[:, 0])))
    assert res.loadings[j, 0] > 0
    with pytest.raises(ValueError, match="missing"):
        capability_pca(np.array([[1.0, np.nan], [2.0, 3.0]]), ["a", "b"], ["p", "q"])


def _rows():
    rows = []
    for s, vals in FIXTURE.items():
        for g, v in zip(GROUPS, vals):
            rows.append({"slice": s, "task": f"{g.lower()}_bench", "group": g, "format": "multiple_choice",
                         "metric": "score", "value": v / 100, "stderr": 0.01, "n": 100, "higher_is_better": True})
        rows.append({"slice": s, "task": "prose_bpb", "group": "General", "format": "bits_per_byte",
                     "metric": "bits_per_byte", "value": 1.0 + vals[0] / 1000, "stderr": 0.001, "n": 50,
                     "higher_is_better": False})
    return rows


def test_profile_groups_average_and_rankings(tmp_path):
    prof = build_profile(_rows())
    assert prof.scores.loc["S01_web_hi", "general_bench"] == pytest.approx(52.0)
    bpb_score = 100 * 2 ** -1.052                                  # per-byte probability in %
    assert prof.scores.loc["S01_web_hi", "prose_bpb"] == pytest.approx(bpb_score)
    assert prof.scores.loc["S01_web_hi", "prose_bpb"] < prof.scores.loc["S08_zh_edu", "prose_bpb"]   # lower bpb wins
    assert prof.groups.loc["S01_web_hi", "General"] == pytest.approx((52.0 + bpb_score) / 2)
    assert prof.groups.loc["S06_code", "Code"] == pytest.approx(24.0)
    assert prof.average["S05_math_syn"] == pytest.approx((45 + 38 + 12 + 28 + 100 * 2 ** -1.045) / 5)
    se = prof.long.query("slice == 'S01_web_hi' and task == 'prose_bpb'")["score_stderr"].item()
    assert se == pytest.approx(np.log(2) * bpb_score * 0.001)
    assert prof.ranks.loc["S06_code", "Code"] == 1 and prof.ranks.loc["S08_zh_edu", "Chinese"] == 1
    assert set(prof.ranks["overall"]) == set(range(1, 9))
    paths = prof.write(tmp_path)
    wide = pd.read_csv(paths["csv"], index_col="slice")
    assert list(wide["rank"]) == sorted(wide["rank"])
    back = read_profile(tmp_path)
    pd.testing.assert_frame_equal(back.scores, prof.scores)
    assert prof.table_lines()[0].startswith("slice")


def test_ranking_is_stable_under_benchmark_permutation():
    rows = _rows()
    base = build_profile(rows).ranks
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        renamed = [{**r, "task": f"{(hash(r['task']) + seed) % 97:02d}_{r['task']}"} for r in shuffled]
        other = build_profile(renamed)
        pd.testing.assert_series_equal(other.ranks["overall"], base["overall"], check_names=False)


def test_threshold_keeps_top_region_when_best_end_dominates():
    slices = [QuantileSlice(0, 57.2, 0.2, "dclm.q00-from-best"), QuantileSlice(25, 55.1, 0.2, "dclm.q25-from-best"),
              QuantileSlice(50, 54.9, 0.2), QuantileSlice(75, 54.0, 0.2)]
    d = select_threshold(slices, component_tokens=680_000_000_000, budget_tokens=34_000_000_000)
    assert d.paying == ["dclm.q00-from-best"] and d.quality_cut_fraction == pytest.approx(0.125)
    assert d.keep_fraction == pytest.approx(0.05) and d.limited_by == "budget"
    assert d.keep_tokens == 34_000_000_000
    # without a budget, the cut is where quality stops paying
    assert select_threshold(slices, 680_000_000_000).keep_fraction == pytest.approx(0.125)


def test_threshold_keeps_more_when_quality_keeps_paying_and_respects_noise():
    flat = [QuantileSlice(0, 50.0, 0.3), QuantileSlice(25, 49.8, 0.3), QuantileSlice(50, 49.9, 0.3),
            QuantileSlice(75, 46.0, 0.3)]
    d = select_threshold(flat, 100, tolerance=0.5)
    assert d.quality_cut_fraction == pytest.approx(0.625) and d.not_paying == ["q75"]
    noisy = [QuantileSlice(0, 50.0, 2.0), QuantileSlice(25, 47.5, 2.0)]
    assert select_threshold(noisy, 100, tolerance=0.5, z=1.0).quality_cut_fraction == 1.0   # within noise
    assert select_threshold(noisy, 100, tolerance=0.5, z=0.5).quality_cut_fraction == pytest.approx(0.125)


def test_score_at_fraction():
    scores = np.array([0.9, 0.1, 0.5, 0.7])
    toks = np.array([10, 10, 10, 10])
    assert score_at_fraction(scores, toks, 0.25) == 0.9
    assert score_at_fraction(scores, toks, 0.5) == 0.7
    assert score_at_fraction(scores, toks, 0.5, higher_is_better=False) == 0.5


def test_power_law_recovers_parameters():
    C = np.logspace(17, 21, 9)
    L = 2.1e3 * C ** -0.17 + 1.7
    fit = fit_power_law(C, L)
    assert fit.a == pytest.approx(2.1e3, rel=1e-3) and fit.b == pytest.approx(-0.17, rel=1e-4)
    assert fit.c == pytest.approx(1.7, rel=1e-4) and fit.rmse < 1e-8
    assert fit.compute_for(float(fit.predict(1e20))) == pytest.approx(1e20, rel=1e-6)


def test_puro_cost_law_inversion_behaviour_33():
    assert invert_cost_law(57.17, 53.86, 1.019) == pytest.approx(11.36, abs=0.05)
    assert invert_cost_law(57.81, 53.86, 1.019) == pytest.approx(16.55, abs=0.05)
    # UD at $6.89K: the fit predicts 56.24 (observed 55.99)
    assert float(cost_law(6.89, 53.86, 1.019)) == pytest.approx(56.24, abs=0.01)
    costs = np.array([3.0, 4.4, 6.89, 9.0, 12.0])
    fit = fit_cost_law(costs, cost_law(costs, 53.86, 1.019))
    assert (fit.a, fit.b) == pytest.approx((53.86, 1.019), abs=1e-9)
    assert fit.invert(57.81) == pytest.approx(16.55, abs=0.05)
    with pytest.raises(ValueError):
        fit_cost_law([1.0, 5.0], [50.0, 55.0])


TRUE = MPLParams(L0=3.04, A=0.525, alpha=0.508, B=363.8, C=2.066, beta=0.583, gamma=0.641)
PEAK, T, SW = 3e-4, 600, 3e-4 * 50


def _sched(kind, n):
    lr = np.full(n, PEAK)
    if kind == "cosine":
        lr = PEAK * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * np.arange(1, n + 1) / n)))
    elif kind == "step":
        lr[n // 2:] = PEAK * 0.3
        lr[3 * n // 4:] = PEAK * 0.1
    elif kind == "wsd":
        d = n // 5
        lr[n - d:] = PEAK * np.linspace(1, 0, d + 1)[1:]
    return lr


def _curve(kind, n, noise=0.0, seed=0):
    lr = _sched(kind, n)
    steps = np.unique(np.linspace(1, n, 60).astype(int))
    loss = mpl_loss(lr, TRUE, steps, SW) + np.random.default_rng(seed).normal(0, noise, len(steps))
    return Curve(lr, steps, loss, SW, PEAK, kind)


def test_mpl_constant_schedule_has_no_decay_term_and_decreases():
    lr = np.full(300, PEAK)
    L = mpl_loss(lr, TRUE, warmup_sum=SW)
    base = TRUE.L0 + TRUE.A * (np.cumsum(lr) + SW) ** -TRUE.alpha
    assert np.allclose(L, base)
    assert (np.diff(L) < 0).all()
    # a decay lowers the loss below the power law at the same learning-rate sum (LD > 0)
    wsd = _sched("wsd", 300)
    no_decay = TRUE.L0 + TRUE.A * (wsd.sum() + SW) ** -TRUE.alpha
    assert mpl_loss(wsd, TRUE, [300], SW)[0] < no_decay - 0.01


def test_mpl_recovers_known_parameters_and_predicts_a_heldout_schedule():
    train = [_curve("constant", T), _curve("cosine", T), _curve("step", T)]
    fit = fit_mpl(train, n_starts=1)
    for name in ("L0", "A", "alpha", "B", "C", "beta", "gamma"):
        assert getattr(fit.params, name) == pytest.approx(getattr(TRUE, name), rel=1e-2), name
    heldout = _curve("wsd", int(T * 1.5))
    assert fit.heldout_rmse(heldout) < 1e-4


def test_mpl_with_noise_reports_heldout_rmse_near_the_noise_level():
    train = [_curve("constant", T, 0.003, 1), _curve("cosine", T, 0.003, 2), _curve("step", T, 0.003, 3)]
    fit = fit_mpl(train, n_starts=2)
    heldout = _curve("wsd", int(T * 1.5))
    assert fit.heldout_rmse(heldout) < 0.01
