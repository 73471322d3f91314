"""Curriculum math (Puro §3.4, §3.6.2) on synthetic pools of many small documents, no I/O.

Numbers in the test names refer to seed-puro.md §10 testable behaviours.
"""

import math

import numpy as np
import pytest

from mixtures import accounting as acc
from mixtures import curriculum as cm
from mixtures.plan import ComponentColumns, bucket_stats, plan_phase_pool, plan_stream
from mixtures.spec import parse_spec

K = 16


def _cols(name, n, seed, scored=True, max_tokens=10):
    rng = np.random.default_rng(seed)
    return ComponentColumns(name=name, ids=[f"{name}-{i}" for i in range(n)],
                            n_tokens=rng.integers(1, max_tokens + 1, size=n),
                            scores=rng.random(n) if scored else None)


def _spec(components, phases, k=K, **extra):
    return parse_spec({"name": "t", "tokenizer": {"kind": "hf", "path": "unused.json"}, "seq_len": 16, "bucket_count": k,
                       "components": components, "phases": phases, **extra})


@pytest.fixture(scope="module")
def big():
    """Three components, ~300k documents of 1-10 tokens: a pool where per-bucket errors are tiny."""
    comps = {"web": _cols("web", 150_000, 1), "math": _cols("math", 90_000, 2), "code": _cols("code", 60_000, 3, scored=False)}
    spec = _spec([{"name": "web", "path": "w", "score_field": "s"},
                  {"name": "math", "path": "m", "score_field": "s", "higher_is_better": False},
                  {"name": "code", "path": "c", "order_seed": 5}],
                 [{"name": "p2", "components": {"web": {}, "math": {}, "code": {}}, "orders": ["curriculum", "uniform"]}])
    retained = {n: np.ones(len(c), bool) for n, c in comps.items()}
    pool = plan_phase_pool(spec, spec.phases[0], comps, retained)
    return spec, comps, pool


def test_rank_definition_5():
    n = np.array([5, 10, 5, 20, 10])
    prefix = cm.exclusive_cumsum(n)
    assert prefix.tolist() == [0, 5, 15, 20, 40]
    r = cm.rank_of(prefix, n.sum())
    assert r.tolist() == [0, 0.1, 0.3, 0.4, 0.8]
    assert cm.bucket_of(prefix, n.sum(), 4).tolist() == [0, 0, 1, 1, 3]
    assert cm.bucket_of(prefix, n.sum(), 1).tolist() == [0] * 5
    with pytest.raises(ValueError):
        cm.bucket_of(prefix, n.sum(), 0)


def test_bucket_count_and_size_2(big):
    spec, comps, pool = big
    total = int(pool.n_tokens.sum())
    max_doc = int(pool.n_tokens.max())
    sizes = np.bincount(pool.bucket, weights=pool.n_tokens, minlength=K)
    assert sizes.size == K and sizes.sum() == total
    assert np.all(np.abs(sizes - total / K) <= max_doc * 3)


def test_mixture_preserved_in_every_bucket_3(big):
    spec, comps, pool = big
    total = pool.n_tokens.sum()
    for ci, c in enumerate(spec.components):
        w = pool.n_tokens[pool.comp == ci].sum() / total
        for k in range(K):
            in_k = pool.bucket == k
            share = pool.n_tokens[in_k & (pool.comp == ci)].sum() / pool.n_tokens[in_k].sum()
            assert abs(share - w) <= 1e-3, (c.name, k, share, w)


def test_within_component_monotonic_4(big):
    spec, comps, pool = big
    for ci, name, sign in ((0, "web", 1.0), (1, "math", -1.0)):
        m = pool.comp == ci
        key = sign * comps[name].scores[pool.row[m]]
        b = pool.bucket[m]
        for k in range(K - 1):
            assert key[b == k].max() <= key[b == k + 1].min()


def test_score_direction_flip_reverses_order_keeps_sizes_6(big):
    spec, comps, pool = big
    flipped = _spec([{"name": "web", "path": "w", "score_field": "s", "higher_is_better": False},
                     {"name": "math", "path": "m", "score_field": "s"},
                     {"name": "code", "path": "c", "order_seed": 5}], [spec.phases[0].model_dump()])
    retained = {n: np.ones(len(c), bool) for n, c in comps.items()}
    pool2 = plan_phase_pool(flipped, flipped.phases[0], comps, retained)
    for ci in (0, 1):
        a, b = pool.row[pool.comp == ci], pool2.row[pool2.comp == ci]
        assert np.array_equal(a, b[::-1])          # scores are distinct: the order reverses exactly
    s1 = np.bincount(pool.bucket, weights=pool.n_tokens, minlength=K)
    s2 = np.bincount(pool2.bucket, weights=pool2.n_tokens, minlength=K)
    assert np.all(np.abs(s1 - s2) <= 3 * 10)
    for ci in range(3):
        t1 = np.bincount(pool.bucket[pool.comp == ci], weights=pool.n_tokens[pool.comp == ci], minlength=K)
        t2 = np.bincount(pool2.bucket[pool2.comp == ci], weights=pool2.n_tokens[pool2.comp == ci], minlength=K)
        assert np.all(np.abs(t1 - t2) <= 10)


def test_unscored_component_is_a_seeded_permutation_7(big):
    spec, comps, pool = big
    code = comps["code"]
    retained = {n: np.ones(len(c), bool) for n, c in comps.items()}
    again = plan_phase_pool(spec, spec.phases[0], comps, retained)
    assert np.array_equal(again.row[again.comp == 2], pool.row[pool.comp == 2])
    other = _spec([c.model_dump() for c in spec.components[:2]] + [{"name": "code", "path": "c", "order_seed": 6}],
                  [spec.phases[0].model_dump()])
    pool3 = plan_phase_pool(other, other.phases[0], comps, retained)
    rows_a, rows_b = pool.row[pool.comp == 2], pool3.row[pool3.comp == 2]
    assert sorted(rows_a) == sorted(rows_b) and not np.array_equal(rows_a, rows_b)
    assert abs(np.corrcoef(rows_a, np.arange(len(code)))[0, 1]) < 0.05    # not the read order
    stats = bucket_stats(spec, pool)
    means = [s.mean_rank_by_component["code"] for s in stats]
    assert np.allclose(means, (np.arange(K) + 0.5) / K, atol=2e-3)          # grows linearly


def test_curriculum_vs_uniform_rank_profiles_9_10(big):
    spec, comps, pool = big
    cur = plan_stream(spec, spec.phases[0], pool, comps, "curriculum")
    uni = plan_stream(spec, spec.phases[0], pool, comps, "uniform")
    # 1: same multiset of documents and tokens
    key = lambda p: sorted(zip(p.comp.tolist(), p.row.tolist(), p.copy.tolist()))  # noqa: E731
    assert key(cur) == key(uni) and cur.n_tokens.sum() == uni.n_tokens.sum()
    total = cur.n_tokens.sum()
    w = {ci: pool.n_tokens[pool.comp == ci].sum() / total for ci in range(3)}
    uni_means = []
    for plan, name in ((cur, "curriculum"), (uni, "uniform")):
        pos = cm.exclusive_cumsum(plan.n_tokens)
        window = (pos * K) // total
        for k in range(K):
            m = window == k
            for ci in range(3):
                mc = m & (plan.comp == ci)
                mean_rank = (plan.rank[mc] * plan.n_tokens[mc]).sum() / plan.n_tokens[mc].sum()
                share = plan.n_tokens[mc].sum() / plan.n_tokens[m].sum()
                if name == "curriculum":
                    assert abs(mean_rank - (k + 0.5) / K) < 2e-3
                    assert abs(share - w[ci]) < 2e-3
                else:
                    assert abs(mean_rank - 0.5) < 0.02 and abs(share - w[ci]) < 0.01
            if name == "uniform":
                uni_means.append((plan.rank[m] * plan.n_tokens[m]).sum() / plan.n_tokens[m].sum())
    rho = _spearman(np.arange(K), np.array(uni_means))
    assert abs(rho) < 0.6      # ~0 in expectation; 16 windows of noise
    assert np.all(np.diff(cur.bucket) >= 0)
    assert np.array_equal(np.unique(cur.segment), [f"b{k:04d}" for k in range(K)])


def _spearman(a, b):
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return np.corrcoef(ra, rb)[0, 1]


def test_transition_shares_13():
    """Over L tokens the phase-2 share rises linearly; each side gives ~L/2; no replay after."""
    rng = np.random.default_rng(0)
    L = 200_000
    p1 = rng.integers(1, 20, size=40_000)
    p2 = rng.integers(1, 20, size=40_000)
    p1_prefix, p2_prefix = cm.exclusive_cumsum(p1), cm.exclusive_cumsum(p2)
    t1, t2 = cm.in_transition(p1_prefix, L), cm.in_transition(p2_prefix, L)
    side, idx = cm.transition_order(p1_prefix[t1], p2_prefix[t2], L)
    n = np.where(side == 0, p1[t1][np.where(side == 0, idx, 0)], p2[t2][np.where(side == 1, idx, 0)])
    assert abs(p1[t1].sum() - L / 2) < 20 and abs(p2[t2].sum() - L / 2) < 20
    # within-side order is preserved
    assert np.all(np.diff(idx[side == 0]) == 1) and np.all(np.diff(idx[side == 1]) == 1)
    # local phase-2 share in 20 steps of the window follows x/L
    pos = cm.exclusive_cumsum(n)
    step = L // 20
    for j in range(20):
        m = (pos >= j * step) & (pos < (j + 1) * step)
        share = n[m & (side == 1)].sum() / n[m].sum()
        assert abs(share - (j + 0.5) / 20) < 0.02, (j, share)
    # the cumulative phase-2 mass at x is x^2 / (2L) within one document
    x = pos[-1]
    assert abs(n[side == 1][:-1].sum() - x * x / (2 * L)) < 2 * 20
    assert cm.linear_p2_share(np.array([0, L / 4, L, 2 * L]), L).tolist() == [0, 0.25, 1, 1]


def test_transition_in_a_stream_leaves_no_replay_after_the_window(big):
    spec, comps, pool = big
    L = 100_000
    spec2 = _spec([c.model_dump() for c in spec.components],
                  [{"name": "p1", "components": {"web": {}, "code": {}}},
                   {"name": "p2", "transition_tokens": L, "components": {"web": {}, "math": {}, "code": {}}}])
    retained = {n: np.ones(len(c), bool) for n, c in comps.items()}
    p1 = plan_phase_pool(spec2, spec2.phases[0], comps, retained)
    p2 = plan_phase_pool(spec2, spec2.phases[1], comps, retained)
    plan = plan_stream(spec2, spec2.phases[1], p2, comps, "curriculum", replay_pool=p1, replay_phase=spec2.phases[0])
    replay = np.array([plan.labels[i].startswith("replay:") for i in plan.label])
    pos = cm.exclusive_cumsum(plan.n_tokens)
    assert replay.any() and pos[replay].max() < L
    assert abs(plan.n_tokens[replay].sum() - L / 2) <= 10
    assert (plan.segment[pos < L - 20] == "t0000").all()
    # every phase-2 document still appears exactly once
    mine = ~replay
    assert sorted(zip(plan.comp[mine], plan.row[mine])) == sorted(zip(p2.comp, p2.row))


def test_token_accounting_reproduces_puro_numbers_14():
    plan = acc.puro_production()
    assert plan.tokens_per_step == 6_291_456
    assert round(plan.phase1_steps) == 69_752
    assert plan.phase2_stage_tokens == pytest.approx(959.01e9 + 0.999e9, rel=1e-3)   # ~960.0B
    assert round(plan.total_steps) == pytest.approx(222_340, abs=2)
    assert plan.bucket_tokens == pytest.approx(2.4948e9, rel=1e-4)
    assert plan.transition_side_tokens == pytest.approx(21.95e9)
    assert acc.buckets_in_transition(43.9e9, 938.06e9, 376) == pytest.approx(8.8, abs=0.01)
    assert acc.token_offset_of_step(218_000, 4096, 1536) == 218_000 * 6_291_456
    assert round(plan.phase2_step_of(218_000)) == 148_248
    assert acc.steps_for_tokens(0.63e9, 4096, 1536) == pytest.approx(100, abs=0.2)


def test_seeded_keys_are_stable_and_salted():
    ids = ["a", "b", "c"]
    k1 = cm.doc_keys(ids, 1, salt="x")
    assert np.array_equal(k1, cm.doc_keys(ids, 1, salt="x"))
    assert not np.array_equal(k1, cm.doc_keys(ids, 2, salt="x"))
    assert not np.array_equal(k1, cm.doc_keys(ids, 1, salt="y"))
    assert not np.array_equal(cm.doc_keys(ids, 1, copies=[0, 0, 0]), cm.doc_keys(ids, 1, copies=[1, 1, 1]))
    # the signed view keeps the order (for Spark's LongType)
    keys = np.array([0, 1, 1 << 63, (1 << 64) - 1], dtype=np.uint64)
    assert np.all(np.diff(cm.signed_order_key(keys)) > 0)


def test_uniform_slot_is_exact_and_balanced():
    keys = cm.doc_keys([str(i) for i in range(50_000)], 3)
    slots = cm.uniform_slot(keys, 376)
    exact = [(int(k) * 376) >> 64 for k in keys[:2000]]
    assert slots[:2000].tolist() == exact
    counts = np.bincount(slots, minlength=376)
    assert counts.size == 376 and counts.min() > 0.6 * counts.mean()


def test_preference_key_missing_scores_come_first():
    key = cm.preference_key(np.array([0.5, np.nan, 0.1]), True)
    assert key.tolist() == [0.5, -math.inf, 0.1]
    assert cm.preference_key(np.array([0.0]), False).tolist() == [0.0] and not np.signbit(cm.preference_key(np.array([0.0]), False)[0])


def test_partition_offsets_make_local_prefixes_global():
    rng = np.random.default_rng(1)
    n = rng.integers(1, 9, size=1000)
    parts = np.array_split(n, 7)
    totals = np.array([[p.sum()] for p in parts])
    offs = cm.partition_offsets(totals)[:, 0]
    glued = np.concatenate([cm.exclusive_cumsum(p) + o for p, o in zip(parts, offs)])
    assert np.array_equal(glued, cm.exclusive_cumsum(n))


def test_budgets_and_repetition():
    budgets, total = cm.phase_budgets({"a": 1000, "b": 500}, {"a": 0.5, "b": 0.5}, {}, None, {"a": False, "b": False})
    assert budgets == {"a": 500, "b": 500} and total == 1000
    budgets, total = cm.phase_budgets({"a": 1000, "b": 500}, {"a": 0.5, "b": 0.5}, {}, None, {"a": False, "b": True})
    assert budgets == {"a": 1000, "b": 1000}
    with pytest.raises(ValueError, match="'b' would need 1,000 tokens but retains 500"):
        cm.phase_budgets({"a": 1000, "b": 500}, {"a": 0.5, "b": 0.5}, {}, 2000, {"a": False, "b": False})
    n = np.full(10, 10)
    assert cm.repeat_copies(n, 45).tolist() == [1] * 5 + [0] * 5
    assert cm.repeat_copies(n, 250).tolist() == [3] * 5 + [2] * 5
    dup = np.array([1, 1, 3, 1, 1, 1, 1, 1, 2, 1])
    assert cm.repeat_copies(n, 130, dup).tolist() == [1, 1, 3, 1, 1, 1, 1, 1, 2, 1]
    rows, copy = cm.expand_copies(np.array([2, 0, 1]))
    assert rows.tolist() == [0, 0, 2] and copy.tolist() == [0, 1, 0]
