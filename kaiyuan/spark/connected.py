"""Connected components of the duplicate graph in Spark: the large-star / small-star rounds of
Kiveris et al. (SoCC 2014), on DataFrames of edges (src, dst) with src > dst, never collected to
the driver (the tests check them against the edge-list reference in `tests/kaiyuan/oracles.py`).

Each round costs two shuffles; the edge set is checkpointed after every round so the plan does
not grow. Before every round one aggregation checks whether the edges already form stars centred
on their smallest node (every node has at most one smaller neighbour, and no node with a smaller
neighbour has larger ones): that is the fixed point, and duplicate graphs built from LSH buckets
often start there, so they need no round at all.
"""

from __future__ import annotations

from purokit.log import get_logger

log = get_logger("kaiyuan.cc")


def canonical_edges(edges):
    """(src, dst) with src > dst, self-loops dropped, distinct."""
    from pyspark.sql import functions as F

    return (edges.where(F.col("src") != F.col("dst"))
            .select(F.greatest("src", "dst").alias("src"), F.least("src", "dst").alias("dst"))
            .distinct())


def large_star(edges):
    """Large-Star on a DataFrame of canonical edges: for each node u, m = min(N(u) + {u}); every
    neighbour v > u is connected to m."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    both = edges.select(F.col("src").alias("u"), F.col("dst").alias("v")).unionByName(
        edges.select(F.col("dst").alias("u"), F.col("src").alias("v")))
    m = F.least(F.col("u"), F.min("v").over(Window.partitionBy("u")))
    return (both.withColumn("m", m).where(F.col("v") > F.col("u"))
            .select(F.col("v").alias("src"), F.col("m").alias("dst")).distinct())


def small_star(edges):
    """Small-Star on a DataFrame of canonical edges (src > dst): for each node u, m = min(N-(u) + {u})
    over its smaller neighbours; u and every smaller neighbour are connected to m."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with_m = edges.withColumn("m", F.min("dst").over(Window.partitionBy("src")))
    to_m = with_m.select("src", F.col("m").alias("dst"))
    leaves = with_m.where(F.col("dst") != F.col("m")).select(F.col("dst").alias("src"), F.col("m").alias("dst"))
    return to_m.unionByName(leaves).distinct()


def n_star_violations(edges) -> int:
    """Nodes that break the star-forest shape of canonical edges (src > dst): a src with two or
    more dst, or a node that is both a src and a dst. Zero means every component is a star whose
    centre is its smallest node."""
    from pyspark.sql import functions as F

    ends = edges.select(F.col("src").alias("node"), F.lit(1).alias("is_src")).unionByName(
        edges.select(F.col("dst").alias("node"), F.lit(0).alias("is_src")))
    per_node = ends.groupBy("node").agg(F.sum("is_src").alias("n_up"), F.min("is_src").alias("min_src"))
    bad = per_node.where((F.col("n_up") > 1) | ((F.col("n_up") >= 1) & (F.col("min_src") == 0)))
    return bad.count()


def materialize(df, reliable: bool):
    """`df` computed once and its lineage cut: a reliable checkpoint when a checkpoint dir is set
    (clusters), otherwise executor-local storage. Plans built on it stay small: a cached
    DataFrame keeps its whole plan, which every plan that reads it repeats."""
    return df.checkpoint(eager=True) if reliable else df.localCheckpoint(eager=True)


def star_components(edges, max_rounds: int = 60, reliable_checkpoint: bool = False):
    """DataFrame (node, root): every node that has an edge, with the smallest node of its
    component; and the number of rounds. `edges` has columns src, dst (any orientation)."""
    from pyspark.sql import functions as F

    current = materialize(canonical_edges(edges), reliable_checkpoint)
    rounds = 0
    while n_star_violations(current) > 0:
        if rounds == max_rounds:
            raise RuntimeError(f"connected components did not converge in {max_rounds} rounds (raise dedup.max_cc_rounds)")
        current = materialize(small_star(large_star(current)), reliable_checkpoint)
        rounds += 1
        log.info("connected components: round %d done", rounds)
    nodes = current.select(F.col("src").alias("node"), F.col("dst").alias("root")).unionByName(
        current.select(F.col("dst").alias("node"), F.col("dst").alias("root"))).distinct()
    return nodes, rounds
