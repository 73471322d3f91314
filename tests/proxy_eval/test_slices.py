"""Slice rules (seed-puro.md behaviour 16) and slice selection."""

from pathlib import Path

import numpy as np
import pytest

from purokit.component import Component
from purokit.errors import ContractError
from proxy_eval.plan import ComponentRef, PlanConfig, SlicePlan, make_plan
from proxy_eval.slices import (KEY_DTYPE, SliceRules, decide_component, key_records, locate, order_key,
                               percentile_band, select_slices, slice_name)
from tests.proxy_eval.helpers import synthetic_scored_component

B = 1_000_000_000
PAPER = SliceRules()


def test_large_scored_source_gets_four_quantile_slices_named_from_best():
    d = decide_component("dclm", 680 * B, scored=True, rules=PAPER, score_field="quality.hq")
    assert d.rule == "quantile"
    assert [s.name for s in d.slices] == ["dclm.q00-from-best", "dclm.q25-from-best", "dclm.q50-from-best",
                                          "dclm.q75-from-best"]
    assert [s.percentile for s in d.slices] == [0, 25, 50, 75]
    assert all(s.target_tokens == 4 * B for s in d.slices)
    # q00 is the best end: its band starts at token-mass 0 in preference order
    assert d.slices[0].band[0] == 0.0
    bands = [s.band for s in d.slices]
    assert all(a[1] <= b[0] for a, b in zip(bands, bands[1:]))


@pytest.mark.parametrize("n_tokens,scored,rule", [
    (60 * B, False, "random"),     # large but unscored
    (50 * B, True, "random"),      # boundary: 5 <= size <= 50 -> one random slice
    (20 * B, True, "random"),
    (5 * B, False, "random"),
    (int(4.99 * B), True, "skip"),
    (50 * B + 1, True, "quantile"),
])
def test_rule_boundaries(n_tokens, scored, rule):
    d = decide_component("c", n_tokens, scored=scored, rules=PAPER)
    assert d.rule == rule
    assert len(d.slices) == {"random": 1, "skip": 0, "quantile": 4}[rule]
    if rule == "random":
        assert d.slices[0].name == "c.random" and d.slices[0].target_tokens == 4 * B


def test_percentile_origin_is_explicit_and_configurable():
    rules = SliceRules(percentile_from="worst")
    d = decide_component("x", 100 * B, True, rules)
    assert d.slices[0].name == "x.q00-from-worst"
    assert slice_name("x", "quantile", 12.5, "best") == "x.q12p5-from-best"


def test_percentile_band_center_and_start():
    assert percentile_band(0, 0.1, "center") == (0.0, 0.1)
    lo, hi = percentile_band(25, 0.1, "center")
    assert (round(lo, 9), round(hi, 9)) == (0.2, 0.3)
    assert percentile_band(25, 0.1, "start") == (0.25, pytest.approx(0.35))
    assert percentile_band(99, 0.1, "start")[1] == pytest.approx(1.0)


def test_overlapping_quantile_slices_are_refused():
    with pytest.raises(ContractError, match="overlap"):
        decide_component("c", 60 * B, True, SliceRules(slice_tokens=20 * B))


def test_locate_finds_the_document_holding_each_position_in_any_chunking():
    """The streaming locator equals a full sort, whatever the chunk size and however many
    documents share a key (integer scores: ties broken by the seeded hash, then the row)."""
    rng = np.random.default_rng(0)
    n = 5000
    ids = [f"d{i}" for i in range(n)]
    toks = rng.integers(0, 500, size=n)
    scores = rng.integers(0, 4, size=n).astype(float)
    scores[rng.random(n) < 0.05] = np.nan
    rec = key_records(ids, toks, scores, seed=3, salt="web")
    ok = ~np.isnan(scores)
    order = np.flatnonzero(ok)[np.lexsort((np.flatnonzero(ok), rec["tie"][ok], rec["key"][ok]))]
    assert (np.diff(-scores[order]) >= 0).all()                  # best first
    before = np.concatenate([[0], np.cumsum(toks[order])[:-1]])
    positions = [0, 1, 777, int(toks[ok].sum()) // 2, int(toks[ok].sum()) - 1, int(toks[ok].sum())]
    for chunk in (97, 1000, n):
        chunks = lambda: (rec[i:i + chunk] for i in range(0, n, chunk))  # noqa: E731
        got = locate(chunks, positions, need=3, use_key=True)
        for p, c in zip(positions[:-1], got[:-1]):
            j = int(np.searchsorted(before + toks[order], p, side="right"))
            assert c.row == order[j] and c.prefix == before[j], (chunk, p)
        assert got[-1] is None                                     # past the end


def test_order_key_ties_and_nans():
    scores = np.array([0.5, -0.0, 0.9, 0.5, -2.0, 0.0])
    best = order_key(scores, True, "best")
    assert np.argsort(best, kind="stable").tolist() == [2, 0, 3, 1, 5, 4]
    assert best[1] == best[5]                                      # -0.0 is 0.0
    assert np.argsort(order_key(scores, True, "worst"), kind="stable").tolist() == [4, 1, 5, 0, 3, 2]
    assert np.argsort(order_key(scores, False, "best"), kind="stable").tolist() == [4, 1, 5, 0, 3, 2]
    rec = key_records(["a", "b"], [1, 1], np.array([np.nan, 1.0]), 0, "c")
    assert rec["flags"].tolist() == [1, 3] and rec.dtype == KEY_DTYPE


def _arrays(n=3000, seed=1):
    rng = np.random.default_rng(seed)
    ids = [f"d{i}" for i in range(n)]
    toks = rng.integers(20, 300, size=n)
    scores = rng.random(n)
    return ids, toks, scores


def test_selected_quantile_slices_are_ordered_disjoint_and_sized():
    ids, toks, scores = _arrays()
    total = int(toks.sum())
    rules = SliceRules(slice_tokens=total // 20, quantile_min_tokens=total // 2, random_min_tokens=total // 10)
    d = decide_component("web", total, True, rules)
    sels = select_slices(d, ids, toks, scores)
    assert [s.spec.name for s in sels] == [f"web.q{p}-from-best" for p in ("00", "25", "50", "75")]
    for s in sels:
        assert 0 <= s.n_tokens - rules.slice_tokens < toks.max()
    all_rows = np.concatenate([s.rows for s in sels])
    assert len(all_rows) == len(set(all_rows.tolist()))
    # from the best end: every q00 doc scores above every q25 doc, and so on
    for a, b in zip(sels, sels[1:]):
        assert scores[a.rows].min() >= scores[b.rows].max()
    # each slice sits around its percentile position in token mass
    order = np.argsort(-scores)
    cum_before = {int(r): int(c) for r, c in zip(order, np.concatenate([[0], np.cumsum(toks[order])[:-1]]))}
    for s in sels[1:]:
        start = min(cum_before[int(r)] for r in s.rows)
        centre = start + s.n_tokens / 2
        assert abs(centre / total - s.spec.percentile / 100) < 0.01


def test_random_slice_is_seeded_and_order_free():
    ids, toks, scores = _arrays()
    total = int(toks.sum())
    rules = SliceRules(slice_tokens=total // 10, quantile_min_tokens=total * 2, random_min_tokens=0, seed=7)
    d = decide_component("web", total, True, rules)
    a = select_slices(d, ids, toks, scores)[0]
    perm = np.random.default_rng(3).permutation(len(ids))
    b = select_slices(d, [ids[i] for i in perm], toks[perm], scores[perm])[0]
    assert sorted(ids[i] for i in a.rows) == sorted(ids[perm[i]] for i in b.rows)
    assert 0 <= a.n_tokens - rules.slice_tokens < toks.max()
    d2 = decide_component("web", total, True, rules.model_copy(update={"seed": 8}))
    c = select_slices(d2, ids, toks, scores)[0]
    assert set(a.rows.tolist()) != set(c.rows.tolist())


def test_make_plan_writes_slice_components_and_is_resumable(tmp_path):
    web = synthetic_scored_component(tmp_path / "components", "web", n_docs=1500, seed=0)
    code = synthetic_scored_component(tmp_path / "components", "code", n_docs=300, seed=1, scored=False)
    tiny = synthetic_scored_component(tmp_path / "components", "tiny", n_docs=20, seed=2)
    web_tokens = Component.open(web).manifest.n_tokens
    rules = SliceRules(slice_tokens=web_tokens // 20, quantile_min_tokens=web_tokens // 2,
                       random_min_tokens=web_tokens // 20)
    cfg = PlanConfig(components=[ComponentRef(path=str(web)), ComponentRef(path=str(code)), ComponentRef(path=str(tiny))],
                     rules=rules, out=str(tmp_path / "plan"))
    plan = make_plan(cfg)
    assert {d.component: d.rule for d in plan.decisions} == {"web": "quantile", "code": "random", "tiny": "skip"}
    assert len(plan.slices) == 5
    for s in plan.slices:
        comp = Component.open(plan.slice_dir(tmp_path / "plan", s.name), verify_hashes=True)
        assert comp.manifest.n_docs == s.n_docs
        assert comp.manifest.n_tokens == s.n_tokens
        assert s.n_tokens >= rules.slice_tokens
        assert "quality.hq" in comp.columns or s.component == "code"
    q = [s for s in plan.slices if s.kind == "quantile"]
    assert q[0].score_range[0] >= q[1].score_range[1]
    reread = SlicePlan.load(tmp_path / "plan")
    assert reread.config_hash == plan.config_hash
    mtime = (tmp_path / "plan" / "manifest.json").stat().st_mtime_ns
    again = make_plan(cfg)
    assert again.created_at == plan.created_at
    assert (tmp_path / "plan" / "manifest.json").stat().st_mtime_ns == mtime


def test_plan_requires_token_counts(tmp_path):
    from tests.proxy_eval.helpers import write_component
    import pyarrow.parquet as pq
    path = write_component(tmp_path, "raw", ["a b c"] * 5)
    # drop n_tokens by rewriting the component without it
    comp = Component.open(path)
    table = comp.read().drop(["n_tokens"])
    d = tmp_path / ".b"
    d.mkdir()
    pq.write_table(table, d / "p.parquet")
    from purokit.component import finalize_component
    finalize_component(d, tmp_path / "raw2", {"job": "t", "name": "raw2"})
    with pytest.raises(ContractError, match="n_tokens"):
        make_plan(PlanConfig(components=[ComponentRef(path=str(tmp_path / "raw2"))], out=str(tmp_path / "p")))


def test_plan_counts_tokens_and_excludes_eval_documents(tmp_path, tokenizer_dir):
    import pyarrow.parquet as pq
    from purokit.component import finalize_component

    path = synthetic_scored_component(tmp_path / "c", "web", n_docs=400, seed=4)
    table = Component.open(path).read().drop(["n_tokens"])
    d = tmp_path / ".b"
    d.mkdir()
    pq.write_table(table, d / "p.parquet")
    finalize_component(d, tmp_path / "raw", {"job": "t", "name": "raw"})
    excluded = [f"web-{i:06d}" for i in range(0, 400, 4)]
    (tmp_path / "eval_ids.txt").write_text("\n".join(excluded) + "\n")
    rules = SliceRules(slice_tokens=5000, quantile_min_tokens=20_000, random_min_tokens=1000, percentiles=[0, 50])
    plan = make_plan(PlanConfig(components=[ComponentRef(path=str(tmp_path / "raw"))], rules=rules,
                                out=str(tmp_path / "plan"), exclude_ids=str(tmp_path / "eval_ids.txt"),
                                count_tokens_with={"kind": "hf", "path": str(tokenizer_dir / "tokenizer.json")}))
    assert plan.counts["excluded_docs"] == 100 and plan.counts["counted_components"] == 1
    for s in plan.slices:
        comp = Component.open(plan.slice_dir(tmp_path / "plan", s.name))
        t = comp.read(columns=["id", "n_tokens"])
        assert not set(t.column("id").to_pylist()) & set(excluded)
        assert sum(t.column("n_tokens").to_pylist()) == s.n_tokens == comp.manifest.n_tokens
        assert 0 <= s.n_tokens - 5000 < max(t.column("n_tokens").to_pylist())


def test_slice_specs_select_the_same_documents_through_mixtures(tmp_path, tokenizer_dir):
    """The spec path (for Spark-sized slices) selects exactly the slice component's documents:
    integer scores with ties, 5% without a score, excluded eval ids, quantile and random slices."""
    from mixtures import ShardSet
    from mixtures.materialize import materialize
    from mixtures.spec import load_spec
    import pyarrow.parquet as pq
    from tests.proxy_eval.helpers import write_component

    rng = np.random.default_rng(5)
    n = 1200
    texts = [" ".join(f"w{rng.integers(0, 999)}" for _ in range(rng.integers(5, 60))) for _ in range(n)]
    scores = [None if rng.random() < 0.05 else float(rng.integers(0, 5)) for _ in range(n)]
    web = write_component(tmp_path / "c", "web", texts, scores, files=3)
    code = write_component(tmp_path / "c", "code", texts[:400], None, files=1)
    excluded = [f"web-{i:06d}" for i in range(0, n, 9)]
    (tmp_path / "eval_ids.txt").write_text("\n".join(excluded) + "\n")
    total = Component.open(web).manifest.n_tokens
    rules = SliceRules(slice_tokens=total // 10, quantile_min_tokens=total // 2, random_min_tokens=1, min_scored_fraction=0.9)
    base = {"tokenizer": {"kind": "hf", "path": str(tokenizer_dir / "tokenizer.json")}, "seq_len": 64}
    plan = make_plan(PlanConfig(components=[ComponentRef(path=str(web)), ComponentRef(path=str(code))], rules=rules,
                                out=str(tmp_path / "plan"), spec_base=base, exclude_ids=str(tmp_path / "eval_ids.txt")))
    assert [s.kind for s in plan.slices] == ["quantile"] * 4 + ["random"]
    for s in plan.slices:
        spec = load_spec(tmp_path / "plan" / s.spec)
        assert spec.components[0].path == str(Path(web if s.component == "web" else code).resolve())
        materialize(spec, tmp_path / "m" / s.name)
        shard_dir = tmp_path / "m" / s.name / "slice-uniform"
        ids = set()
        for shard in ShardSet.open(shard_dir).manifest.shards:
            ids |= set(pq.read_table(shard_dir / f"{shard.name}.idx.parquet", columns=["doc_id"]).column("doc_id").to_pylist())
        mine = set(Component.open(plan.slice_dir(tmp_path / "plan", s.name)).read(columns=["id"]).column("id").to_pylist())
        assert ids == mine and len(mine) == s.n_docs, s.name
        assert not mine & set(excluded)


def test_same_inputs_and_seeds_give_byte_identical_slices(tmp_path):
    from purokit.hashing import sha256_file

    web = synthetic_scored_component(tmp_path / "c", "web", n_docs=800, seed=9)
    total = Component.open(web).manifest.n_tokens
    rules = SliceRules(slice_tokens=total // 10, quantile_min_tokens=total // 2, random_min_tokens=1, seed=3)
    digests = []
    for run in ("a", "b"):
        plan = make_plan(PlanConfig(components=[ComponentRef(path=str(web))], rules=rules, out=str(tmp_path / run)))
        files = sorted((tmp_path / run / "slices").rglob("*.parquet"))
        digests.append([(f.relative_to(tmp_path / run).as_posix(), sha256_file(f)) for f in files])
        digests[-1].append(("plan", [(s.name, s.n_docs, s.n_tokens, s.score_range) for s in plan.slices]))
    assert digests[0] == digests[1] and len(digests[0]) > 4
    other = make_plan(PlanConfig(components=[ComponentRef(path=str(web))], rules=rules.model_copy(update={"seed": 4}),
                                 out=str(tmp_path / "c2")))
    # the seed only breaks ties and orders random slices: quantile slices of distinct scores stay the same
    assert [s.n_docs for s in other.slices] == [s[1] for s in digests[0][-1][1]]


def test_auto_score_field_must_be_unambiguous(tmp_path):
    from tests.proxy_eval.helpers import write_component
    import pyarrow as pa
    import pyarrow.parquet as pq
    from purokit.component import finalize_component

    path = write_component(tmp_path, "two", ["a b c d"] * 10, scores=[0.5] * 10)
    table = Component.open(path).read()
    table = table.append_column(pa.field("quality.other", pa.float64()), pa.array([0.1] * 10))
    d = tmp_path / ".b"
    d.mkdir()
    pq.write_table(table, d / "p.parquet")
    finalize_component(d, tmp_path / "two2", {"job": "t", "name": "two2"})
    with pytest.raises(ContractError, match="several score columns"):
        make_plan(PlanConfig(components=[ComponentRef(path=str(tmp_path / "two2"))], out=str(tmp_path / "p")))
    plan = make_plan(PlanConfig(components=[ComponentRef(path=str(tmp_path / "two2"), score_field="other")],
                                rules=SliceRules(slice_tokens=5, quantile_min_tokens=10, random_min_tokens=1,
                                                 percentiles=[0, 50]), out=str(tmp_path / "p")))
    assert plan.slices[0].score_field == "quality.other"
