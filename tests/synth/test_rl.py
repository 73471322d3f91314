"""Pass-rate filter and curriculum (LN testable 19-21), rollout provenance (Ring-linear §4.4)."""

from __future__ import annotations

import random

import pytest

from synth import rl
from synth.client import ChatResult


def test_difficulty_filter_matches_ln_super():
    rates = [k / 8 for k in range(9)]
    kept = [r for r in rates if rl.difficulty_filter(r) is None]
    assert kept == [0, 1 / 8, 2 / 8, 3 / 8, 4 / 8, 5 / 8]            # 6/8 and above dropped
    assert rl.difficulty_filter(0.0, drop_never_solved=True) == "never solved: pass rate 0"
    assert "too hard" in rl.difficulty_filter(0.125, min_pass_rate=0.2)
    assert rl.pass_rate([True, False, False, True]) == 0.5
    with pytest.raises(ValueError):
        rl.pass_rate([])


def test_easy_to_hard_is_non_increasing_and_seeded():
    items = [(f"p{i}", random.Random(i).choice([0, .125, .25, .5])) for i in range(50)]
    order = rl.order_easy_to_hard(items, seed=3)
    rate = dict(items)
    assert all(rate[a] >= rate[b] for a, b in zip(order, order[1:]))
    assert order == rl.order_easy_to_hard(items, seed=3) and sorted(order) == sorted(rate)


def _spearman(xs, ys):
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = k
        return r
    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1))


def test_gaussian_batches_properties():
    rng = random.Random(0)
    items = [(f"p{i}", rng.randint(0, 5) / 8) for i in range(2000)]
    batches = rl.gaussian_curriculum_batches(items, batch_size=64, seed=1)
    assert all(len(b) == 64 for b in batches[:-1]) and 0 < len(batches[-1]) <= 64
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) == len(items)
    rate = dict(items)
    means = [sum(rate[i] for i in b) / len(b) for b in batches]
    assert _spearman(list(range(len(means))), means) <= -0.9            # easy -> hard
    assert batches == rl.gaussian_curriculum_batches(items, batch_size=64, seed=1)
    assert any([rate[i] for i in b] != sorted([rate[i] for i in b], reverse=True) for b in batches)   # shuffled


def test_fill_rule_takes_the_largest_remaining_pool_when_the_target_runs_out():
    items = [(f"easy{i}", 0.625) for i in range(2)] + [(f"mid{i}", 0.25) for i in range(30)] + \
            [(f"hard{i}", 0.0) for i in range(10)]
    b0 = rl.gaussian_curriculum_batches(items, batch_size=10, sigma=0.05, mu_start=0.625, mu_end=0.0, seed=0)[0]
    # the target wants only 0.625 (2 available); the 8 left come from the largest pool (0.25: 30 > 10)
    assert sum(i.startswith("easy") for i in b0) == 2 and sum(i.startswith("mid") for i in b0) == 8


def test_rollout_fields_keep_engine_ids_and_refuse_misaligned_logprobs():
    res = ChatResult(content="4", finish_reason="length", token_ids=[5, 6], logprobs=[-0.1, -0.2],
                     prompt_token_ids=[1, 2, 3])
    t = {"model": "pol", "engine": "vllm", "logprobs_mode": "processed_logprobs", "precision": "fp8"}
    ro = rl.rollout_fields(res, t, {"temperature": 1.0, "top_p": 1.0}, 9, 2048)
    assert ro["completion_token_ids"] == [5, 6] and ro["truncated"] and ro["logprobs_after_sampling_transforms"]
    assert ro["policy"] == "pol" and ro["precision"] == "fp8" and ro["token_ids_source"] == "engine"
    res.logprobs = [-0.1]
    assert rl.rollout_fields(res, t, {}, 9)["rollout_logprobs"] is None
    res.token_ids = None
    assert rl.rollout_fields(res, t, {}, 9)["token_ids_source"] == "none"


def _spearman_tied(xs, ys):
    """Spearman's rho with average ranks for ties (a plateau of equal means is neither order)."""
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def test_gaussian_curriculum_is_monotone_easy_to_hard_on_skewed_pools():
    """LN §6.2's intent on pools the target cannot follow: 60% of prompts at 5/8, mostly unsolved,
    bimodal. Full batches come easiest first (mean pass rate never rises) and Spearman of batch
    index vs mean pass rate is strongly negative."""
    rng = random.Random(0)
    shapes = {
        "60% at 5/8": [5 / 8 if rng.random() < 0.6 else rng.randint(0, 7) / 8 for _ in range(2000)],
        "mostly unsolved": [0.0 if rng.random() < 0.7 else rng.randint(1, 7) / 8 for _ in range(2000)],
        "bimodal": [rng.choice([0, 1, 6, 7]) / 8 if rng.random() < 0.9 else rng.randint(0, 7) / 8 for _ in range(2000)],
    }
    for name, rates in shapes.items():
        items = [(f"p{i}", r) for i, r in enumerate(rates)]
        batches = rl.gaussian_curriculum_batches(items, batch_size=64, seed=1)
        assert sorted(i for b in batches for i in b) == sorted(i for i, _ in items), name
        rate = dict(items)
        means = [sum(rate[i] for i in b) / len(b) for b in batches]
        full = means[:-1] if len(batches[-1]) < 64 else means
        assert all(a >= b for a, b in zip(full, full[1:])), name
        assert _spearman_tied(list(range(len(means))), means) <= -0.85, name
