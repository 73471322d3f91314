"""Curriculum math (Puro §3.4, §3.6.2) on synthetic pools of many small documents, no I/O.

Numbers in the test names refer to seed-puro.md §10 testable behaviours.
"""

import math

import numpy as np
import pytest

from tests.mixtures import accounting as acc
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


# ---- repetition that respects dedup (issue 17) ---------------------------------------------------

def _rounds_reference(n, budget, caps):
    """The round-by-round rule `capped_extra_copies` closes: round c takes, in budget order, the
    documents allowed more than c copies while their prefix in the round is below what is missing."""
    copies = np.ones_like(n)
    extra = budget - int(n.sum())
    c = 1
    while extra > 0 and (caps > c).any():
        eligible = caps > c
        take = eligible & (cm.exclusive_cumsum(np.where(eligible, n, 0)) < extra)
        copies += take
        extra -= int(n[take].sum())
        c += 1
    return copies


def test_copy_caps_cap_dup_count_and_log_dup_count():
    dup = np.array([0, 1, 2, 3, 4, 7, 8, 12, 5000, 2**40])
    assert cm.copy_caps(dup, "dup_count", 4).tolist() == [1, 1, 2, 3, 4, 4, 4, 4, 4, 4]
    assert cm.copy_caps(dup, "log_dup_count", 100).tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 13, 41]
    assert cm.floor_log2(np.array([1, 2, 3, 2**62 - 1, 2**62])).tolist() == [0, 1, 1, 61, 62]


@pytest.mark.parametrize("seed", range(20))
def test_capped_passes_in_one_step_equal_the_round_by_round_rule(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(1, 50, size=200)
    caps = cm.copy_caps(rng.choice([1, 1, 1, 2, 3, 12, 5000], size=n.size), "dup_count", int(rng.integers(2, 7)))
    supply = cm.capped_supply(n, caps)
    budget = int(rng.integers(int(n.sum()) + 1, supply + 1))
    got = cm.repeat_copies(n, budget, caps)
    assert got.tolist() == _rounds_reference(n, budget, caps).tolist()
    assert (got <= caps).all() and budget <= int((got * n).sum()) < budget + n.max()


def test_a_dup_count_5000_document_takes_at_most_its_cap():
    n = np.full(100, 10)
    dup = np.ones(100, dtype=np.int64)
    dup[0] = 5000
    caps = cm.copy_caps(dup, "dup_count", 4)
    copies = cm.repeat_copies(n, 1030, caps)
    assert copies[0] == 4 and (copies[1:] == 1).all()        # the template takes its cap, nothing more
    assert cm.extra_pass_masks(n, caps).shape == (100, 3)     # passes bounded by max_copies, not by 5,000
    budgets, _ = cm.phase_budgets({"a": 1000}, None, {"a": 1030}, None, {"a": True}, {"a": cm.capped_supply(n, caps)})
    assert budgets == {"a": 1030}
    with pytest.raises(ValueError, match="capped repetition supplies at most 1,030"):
        cm.phase_budgets({"a": 1000}, None, {"a": 1031}, None, {"a": True}, {"a": cm.capped_supply(n, caps)})


def test_copies_are_ranked_within_their_pass_so_they_land_in_different_buckets():
    """4x uniform repetition of a scored component: each pass is less preferred first, and a
    document's copies sit a pass apart (not side by side, as ordering by score alone puts them)."""
    comps = {"web": _cols("web", 5000, 11)}
    spec = _spec([{"name": "web", "path": "w", "score_field": "s", "repeat": "uniform"}],
                 [{"name": "p", "components": {"web": {"n_tokens": int(4 * comps["web"].n_tokens.sum())}},
                   "orders": ["curriculum"]}])
    pool = plan_phase_pool(spec, spec.phases[0], comps, {"web": np.ones(5000, bool)})
    assert pool.copy.max() == 3
    buckets = {}
    for r, b in zip(pool.row.tolist(), pool.bucket.tolist()):
        buckets.setdefault(r, set()).add(b)
    assert min(len(v) for v in buckets.values()) >= 2 and np.mean([len(v) == 4 for v in buckets.values()]) > 0.9
    scores = comps["web"].scores[pool.row]
    for c in range(4):                                          # the curriculum holds inside every pass
        m = pool.copy == c
        assert np.all(np.diff(scores[m]) >= 0)
        assert (np.flatnonzero(m).min(), np.flatnonzero(m).max()) == (m.argmax(), m.size - 1 - m[::-1].argmax())
