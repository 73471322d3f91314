"""Reference implementations the kaiyuan Spark jobs are tested against (no product code calls them).

Connected components by alternating large-star and small-star operations.

Kiveris, Lattanzi, Mirrokni, Rastogi, Vassilvitskii, "Connected Components in MapReduce and
Beyond" (SoCC 2014): every round applies Large-Star then Small-Star to the edge set; the
fixed point is a set of stars in which every node points at the smallest node of its component.
The rounds needed grow as O(log^2 n), so long chains of near-duplicates do not need one round per
hop (plain min-label propagation would).

These pure functions define the steps on Python edge lists. `kaiyuan.spark.connected` performs
the same steps on Spark DataFrames, and its tests compare the two (and both with union-find).
Nodes are any totally ordered values (kaiyuan uses "<source>\\x1f<id>" strings, so the smallest
node of a cluster is its smallest (source, id)).

Which document of a duplicate cluster survives (issue 2: "one deterministic representative per
cluster (smallest id, or the highest value of a named score column)"): ties and missing scores are
broken by the smallest node, so the choice never depends on the order in which Spark happens to see
the rows. `kaiyuan.spark.dedup` implements the same ordering as a window `ORDER BY`;
`choose_representative` is what its tests check it against.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Iterable, Literal, Optional, TypeVar

N = TypeVar("N", bound=Hashable)
Edge = tuple  # (node, node)


def canonical(edges: Iterable[Edge]) -> set[Edge]:
    """Undirected edges as (larger, smaller) pairs, self-loops dropped."""
    return {(max(u, v), min(u, v)) for u, v in edges if u != v}


def large_star(edges: Iterable[Edge]) -> set[Edge]:
    """For each node u with neighbourhood N(u): m = min(N(u) + {u}); connect every neighbour
    v > u to m. Output as canonical (v, m) pairs."""
    nbrs: dict = defaultdict(set)
    for u, v in edges:
        if u != v:
            nbrs[u].add(v)
            nbrs[v].add(u)
    out: set[Edge] = set()
    for u, ns in nbrs.items():
        m = min(min(ns), u)
        for v in ns:
            if v > u:
                out.add((v, m))
    return out


def small_star(edges: Iterable[Edge]) -> set[Edge]:
    """For each node u with smaller neighbours N-(u): m = min(N-(u) + {u}); connect u and every
    v in N-(u) to m. Output as canonical pairs, self-loops dropped."""
    lower: dict = defaultdict(set)
    for u, v in canonical(edges):
        lower[u].add(v)          # canonical: u > v
    out: set[Edge] = set()
    for u, ns in lower.items():
        m = min(ns)
        out.add((u, m))
        for v in ns:
            if v != m:
                out.add((v, m))
    return out


def is_star_forest(edges: set[Edge]) -> bool:
    """True when canonical edges (larger, smaller) form stars centred on their smallest node:
    every node has at most one smaller neighbour, and a node with one has no larger neighbours.
    This is the fixed point of the two steps (they return such an edge set unchanged)."""
    srcs: dict = defaultdict(int)
    dsts = set()
    for u, v in edges:
        srcs[u] += 1
        dsts.add(v)
    return all(n == 1 for n in srcs.values()) and not (set(srcs) & dsts)


def star_components(edges: Iterable[Edge], max_rounds: int = 100) -> tuple[dict, int]:
    """Node -> smallest node of its component, for every node that has an edge; and the number
    of rounds (Large-Star then Small-Star) it took to reach a star forest."""
    current = canonical(edges)
    rounds = 0
    while not is_star_forest(current):
        if rounds == max_rounds:
            raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")
        current = small_star(large_star(current))
        rounds += 1
    return {v: m for v, m in current} | {m: m for _, m in current}, rounds


def union_find_components(edges: Iterable[Edge]) -> dict:
    """Reference: node -> smallest node of its component, by union-find."""
    parent: dict = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        ru, rv = find(u), find(v)
        if ru != rv:
            if ru < rv:
                parent[rv] = ru
            else:
                parent[ru] = rv
    return {x: find(x) for x in list(parent)}


def sort_key(node: Hashable, score: Optional[float], by: Literal["id", "score"], higher_is_better: bool = True) -> tuple:
    """Ascending sort key: the representative is the member with the smallest key."""
    if by == "id":
        return (node,)
    missing = score is None or (isinstance(score, float) and math.isnan(score))
    if missing:
        return (1, 0.0, node)            # documents without a score come last
    return (0, -score if higher_is_better else score, node)


def choose_representative(members: Iterable[tuple[Hashable, Optional[float]]], by: Literal["id", "score"] = "id",
                          higher_is_better: bool = True) -> Hashable:
    """The surviving node among (node, score) members."""
    return min(members, key=lambda m: sort_key(m[0], m[1], by, higher_is_better))[0]
