"""Connected components (large-star / small-star), representatives and exact keys: pure functions."""

import random

import pytest

from kaiyuan import exact
from tests.kaiyuan import oracles
from tests.kaiyuan.oracles import choose_representative


def _random_graph(rng, n_nodes, n_edges):
    return [(f"n{rng.randrange(n_nodes):04d}", f"n{rng.randrange(n_nodes):04d}") for _ in range(n_edges)]


@pytest.mark.parametrize("seed", range(6))
def test_star_components_equal_union_find(seed):
    rng = random.Random(seed)
    edges = _random_graph(rng, 300, rng.randrange(50, 400))
    got, rounds = oracles.star_components(edges)
    want = oracles.union_find_components(edges)
    want = {k: v for k, v in want.items() if any(k in e for e in edges if e[0] != e[1])}
    assert got == want


def test_long_chain_converges_in_few_rounds():
    nodes = [f"{i:05d}" for i in range(2000)]
    rng = random.Random(1)
    rng.shuffle(nodes)
    edges = list(zip(nodes, nodes[1:]))              # one path through all nodes, in random order
    got, rounds = oracles.star_components(edges)
    assert set(got.values()) == {"00000"}
    assert rounds < 40                                 # min-label propagation would need ~2000


def test_steps_on_a_small_example():
    e = {(4, 3), (3, 2), (2, 1)}                      # the path 4-3-2-1
    ls = oracles.large_star(e)
    assert ls == {(2, 1), (3, 1), (4, 2)}             # larger neighbours re-attach to the neighbourhood min
    assert oracles.small_star(ls) == {(2, 1), (3, 1), (4, 2)}
    assert oracles.large_star(oracles.small_star(ls)) == {(2, 1), (3, 1), (4, 1)}
    final, rounds = oracles.star_components(e)
    assert final == {1: 1, 2: 1, 3: 1, 4: 1}
    assert rounds == 2
    assert oracles.is_star_forest({(2, 1), (3, 1), (4, 1), (9, 5)})
    assert not oracles.is_star_forest({(2, 1), (3, 2)})                # 2 has a smaller and a larger neighbour
    assert not oracles.is_star_forest({(3, 1), (3, 2)})                # 3 has two smaller neighbours
    assert oracles.star_components({(2, 1), (3, 1)})[1] == 0           # already stars: no round needed


def test_representative_by_id_and_by_score():
    members = [("b", 0.9), ("a", 0.1), ("c", None), ("d", 0.9)]
    assert choose_representative(members, "id") == "a"
    assert choose_representative(members, "score") == "b"            # tie at 0.9 -> smaller node
    assert choose_representative(members, "score", higher_is_better=False) == "a"
    assert choose_representative([("x", None), ("y", float("nan"))], "score") == "x"


def test_exact_normalization():
    assert exact.normalize_exact("  Hello\u00a0  WORLD\n\tStraße ﬁ ") == "hello world strasse fi"
    assert exact.exact_key("A  b") == exact.exact_key("a b")
    assert exact.exact_key("a b") != exact.exact_key("a  c")
    assert len(exact.exact_key("x")) == 16
