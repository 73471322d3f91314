"""Optimizer-state placement across ranks (Puro §3.1.3, behaviour 32): the paper's greedy placement and
the layer-wise zigzag baseline it replaces. No product code places optimizer state this way (FSDP2 shards
every tensor), so the planner lives beside the test that checks the paper's claim (issue 36)."""

from __future__ import annotations

import math


def place_greedy(muon_sizes: list[int], adam_sizes: list[int], n_ranks: int) -> list[list[tuple[str, int, int]]]:
    """Puro §3.1.3: keep Muon tensors intact and assign them greedily by size (largest first, to the
    least loaded rank, like bin packing); then spread the flattened Adam tensors to level the ranks.

    Returns per rank a list of (kind, tensor index, elements). Adam tensors may be split: an entry
    then holds part of a tensor's elements."""
    load = [0] * n_ranks
    placement: list[list[tuple[str, int, int]]] = [[] for _ in range(n_ranks)]
    for i in sorted(range(len(muon_sizes)), key=lambda j: (-muon_sizes[j], j)):
        r = min(range(n_ranks), key=lambda k: (load[k], k))
        placement[r].append(("muon", i, muon_sizes[i]))
        load[r] += muon_sizes[i]
    shares = water_fill(load, sum(adam_sizes))
    cursor = [(i, s) for i, s in enumerate(adam_sizes) if s]
    ci = 0
    for r in range(n_ranks):
        need = shares[r]
        while need > 0 and ci < len(cursor):
            i, left = cursor[ci]
            take = min(need, left)
            placement[r].append(("adam", i, take))
            load[r] += take
            need -= take
            if take == left:
                ci += 1
            else:
                cursor[ci] = (i, left - take)
    return placement


def water_fill(load: list[int], amount: int) -> list[int]:
    """Integer amounts to add to each rank so that the lowest loads rise to a common level."""
    order = sorted(range(len(load)), key=lambda k: (load[k], k))
    level, left = float(load[order[0]]), float(amount)
    for j in range(len(order)):
        width = j + 1
        nxt = load[order[j + 1]] if j + 1 < len(order) else math.inf
        if left <= (nxt - level) * width:
            level += left / width
            break
        left -= (nxt - level) * width
        level = nxt
    shares = [max(0, int(level - l)) for l in load]
    for k in order:                            # hand out the rounding remainder, lowest first
        if sum(shares) >= amount:
            break
        shares[k] += 1
    i = 0
    while sum(shares) > amount:                # never more than asked
        k = order[-1 - (i % len(order))]
        if shares[k]:
            shares[k] -= 1
        i += 1
    return shares


def place_zigzag(layer_sizes: list[int], n_ranks: int) -> list[int]:
    """The layer-wise zigzag baseline Puro replaces: layer i goes to rank i mod 2n folded back
    (0,1,...,n-1,n-1,...,0,...). Returns per-rank element loads."""
    load = [0] * n_ranks
    for i, s in enumerate(layer_sizes):
        k = i % (2 * n_ranks)
        load[k if k < n_ranks else 2 * n_ranks - 1 - k] += s
    return load


def placement_loads(placement: list[list[tuple[str, int, int]]]) -> list[int]:
    return [sum(n for _, _, n in rank) for rank in placement]
