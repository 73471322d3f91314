"""Which document of a duplicate cluster survives (issue 2: "one deterministic representative per
cluster (smallest id, or the highest value of a named score column)").

Ties and missing scores are broken by the smallest node, so the choice never depends on the
order in which Spark happens to see the rows. `kaiyuan.spark.dedup` implements the same ordering
as a window `ORDER BY`; its tests check it against this function.
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, Literal, Optional


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
