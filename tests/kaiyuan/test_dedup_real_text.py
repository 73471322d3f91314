"""Near-duplicate removal on real text (the GPL-3 as installed in /usr/share/common-licenses by
Debian's base-files): a templated chain that only verified all-pairs candidates keep whole, near
misses that LSH may pair but exact verification must reject, and an exact copy."""

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purokit.component import Component
from tests.kaiyuan import oracles
from kaiyuan import minhash as mh
from kaiyuan.config import RunConfig
from kaiyuan.spark.dedup import bucket_pairs, run_dedup
from kaiyuan.spark.ingest import run_ingest

from .conftest import write_jsonl

GPL3 = Path("/usr/share/common-licenses/GPL-3")
THRESHOLD = 0.7


def _shingles(text: str) -> set:
    norm = mh.normalize_for_shingles(pa.array([text]))[0].as_py()
    words = [w for w in pa.compute.split_pattern_regex(pa.array([norm]), mh._SEPARATORS)[0].as_py() if w]
    return {tuple(words[i:i + 5]) for i in range(len(words) - 4)}


@pytest.fixture(scope="module")
def docs():
    if not GPL3.is_file():
        pytest.skip(f"{GPL3} not installed")
    words = GPL3.read_text().split()

    def window(start, n=400):
        return " ".join(words[start:start + n])

    # a chain of pages shifted by 50 words: neighbours J ~ 0.78, the ends J ~ 0.60; the smallest
    # id is an end, so a star from it (one verified edge per bucket member) would lose a2
    chain = {"a0": window(0), "a1": window(50), "a2": window(100)}
    # two pages 100 words apart (J ~ 0.60): same template, not duplicates
    near_miss = {"b0": window(1200), "b1": window(1300)}
    exact = {"c0": window(3000), "c1": "  " + window(3000).upper().replace(" ", "\n ")}
    singles = {f"s{i}": window(3600 + 450 * i) for i in range(3)}
    return {**chain, **near_miss, **exact, **singles}


def test_designed_jaccards(docs):
    j = {(a, b): mh.exact_jaccard(_shingles(docs[a]), _shingles(docs[b])) for a, b in itertools.combinations(sorted(docs), 2)}
    assert j[("a0", "a1")] >= THRESHOLD and j[("a1", "a2")] >= THRESHOLD
    assert j[("a0", "a2")] < THRESHOLD                     # a0 and a2 are duplicates only through a1
    assert 0.5 < j[("b0", "b1")] < THRESHOLD
    assert j[("c0", "c1")] == 1.0


def test_dedup_keeps_exactly_the_true_clusters(spark, tmp_path, docs):
    write_jsonl(tmp_path / "raw" / "gpl.jsonl", [{"id": k, "text": v} for k, v in sorted(docs.items())])
    cfg = RunConfig.model_validate({"output": str(tmp_path / "out"),
                                    "sources": [{"name": "gpl", "paths": [str(tmp_path / "raw")], "id_field": "id"}],
                                    "dedup": {"threshold": THRESHOLD}})
    run_ingest(spark, cfg)
    m = run_dedup(spark, cfg)["gpl"]
    c = Component.open(cfg.stage_dir("dedup") / "gpl")
    kept = {r["id"]: r for r in c.read(["id", "dup_cluster", "dup_count"]).to_pylist()}
    removed = {r["id"]: r for r in pq.read_table(c.directory / "_removed").to_pylist()}
    clusters = {}
    for i, r in {**kept, **removed}.items():
        clusters.setdefault(r["dup_cluster"], set()).add(i)
    # brute force: union-find over every pair with exact J >= threshold
    sets = {k: _shingles(v) for k, v in docs.items()}
    true = [(a, b) for a, b in itertools.combinations(sorted(docs), 2) if mh.exact_jaccard(sets[a], sets[b]) >= THRESHOLD]
    roots = oracles.union_find_components(true)
    expected = {}
    for k in docs:
        expected.setdefault(roots.get(k, k), set()).add(k)
    assert sorted(map(sorted, clusters.values())) == sorted(map(sorted, expected.values()))
    assert sorted(map(sorted, clusters.values())) == [["a0", "a1", "a2"], ["b0"], ["b1"], ["c0", "c1"], ["s0"], ["s1"], ["s2"]]
    assert kept["a0"]["dup_count"] == 3 and kept["a0"]["dup_cluster"] == "gpl/a0"
    assert set(removed) == {"a1", "a2", "c1"}
    # every removal names the verified edge that removed it, with the exact Jaccard
    best_of_a1 = max(("a0", "a2"), key=lambda p: (mh.exact_jaccard(sets["a1"], sets[p]), p == "a0"))
    for i, partner in (("a1", best_of_a1), ("a2", "a1")):
        assert removed[i]["kind"] == "near" and removed[i]["partner"] == f"gpl/{partner}"
        assert removed[i]["jaccard"] == pytest.approx(mh.exact_jaccard(sets[i], sets[partner]), abs=1e-12)
    assert (removed["c1"]["kind"], removed["c1"]["partner"], removed["c1"]["jaccard"]) == ("exact", "gpl/c0", 1.0)
    assert m.counts["verified_pairs"] == 2                   # a0-a1, a1-a2; b0-b1 rejected if it was a candidate
    assert m.counts["candidate_pairs"] >= 2


def test_big_buckets_pair_each_member_with_its_sorted_neighbours(spark):
    # one bucket of 10 members (beyond all_pairs_max = 4): each pairs with the next 2 in band-key order
    rows = [(f"n{i}", [7, 100 + (9 - i)], 100) for i in range(10)] + [("x0", [8, 1], 100), ("x1", [8, 2], 100)]
    rows += [("y0", [8, 3], 60)]                             # in x's bucket, but 60/100 < 0.7: J >= 0.7 impossible
    df = spark.createDataFrame(rows, "node string, bands array<bigint>, n_sh bigint")
    pairs, sized = bucket_pairs(df, [], all_pairs_max=4, window=2, threshold=0.7)
    got = {(r["src"], r["dst"]) for r in pairs.collect()}
    sized.unpersist()
    order = [f"n{i}" for i in range(9, -1, -1)]             # ascending second band key
    want = {(max(order[k], order[k + d]), min(order[k], order[k + d])) for k in range(10) for d in (1, 2) if k + d < 10}
    assert got == want | {("x1", "x0")}                     # the small bucket (band 0, key 8): all pairs
