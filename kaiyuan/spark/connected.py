"""Connected components of the duplicate graph in Spark: the large-star / small-star rounds of
`kaiyuan.graph`, on DataFrames of edges (src, dst) with src > dst, never collected to the driver.

Each round costs two shuffles; the edge set is checkpointed after every round so the plan does
not grow. Convergence is detected by comparing the count and an order-independent xor-hash of
the edge set before and after a round (at the fixed point both steps return their input).
"""

from __future__ import annotations

from common.log import get_logger

log = get_logger("kaiyuan.cc")


def canonical_edges(edges):
    """(src, dst) with src > dst, self-loops dropped, distinct."""
    from pyspark.sql import functions as F

    return (edges.where(F.col("src") != F.col("dst"))
            .select(F.greatest("src", "dst").alias("src"), F.least("src", "dst").alias("dst"))
            .distinct())


def large_star(edges):
    """`kaiyuan.graph.large_star` on a DataFrame of canonical edges."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    both = edges.select(F.col("src").alias("u"), F.col("dst").alias("v")).unionByName(
        edges.select(F.col("dst").alias("u"), F.col("src").alias("v")))
    m = F.least(F.col("u"), F.min("v").over(Window.partitionBy("u")))
    return (both.withColumn("m", m).where(F.col("v") > F.col("u"))
            .select(F.col("v").alias("src"), F.col("m").alias("dst")).distinct())


def small_star(edges):
    """`kaiyuan.graph.small_star` on a DataFrame of canonical edges (src > dst)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    with_m = edges.withColumn("m", F.min("dst").over(Window.partitionBy("src")))
    to_m = with_m.select("src", F.col("m").alias("dst"))
    leaves = with_m.where(F.col("dst") != F.col("m")).select(F.col("dst").alias("src"), F.col("m").alias("dst"))
    return to_m.unionByName(leaves).distinct()


def _fingerprint(edges) -> tuple[int, int]:
    from pyspark.sql import functions as F

    row = edges.agg(F.count("*").alias("n"), F.bit_xor(F.xxhash64("src", "dst")).alias("x")).collect()[0]
    return int(row["n"]), int(row["x"] or 0)


def _materialize(df, reliable: bool):
    # cut the lineage each round: a reliable checkpoint when a checkpoint dir is set (clusters),
    # otherwise executor-local storage
    return df.checkpoint(eager=True) if reliable else df.localCheckpoint(eager=True)


def star_components(edges, max_rounds: int = 60, reliable_checkpoint: bool = False):
    """DataFrame (node, root): every node that has an edge, with the smallest node of its
    component; and the number of rounds. `edges` has columns src, dst (any orientation)."""
    from pyspark.sql import functions as F

    current = _materialize(canonical_edges(edges), reliable_checkpoint)
    before = _fingerprint(current)
    if before[0] == 0:
        spark = edges.sparkSession
        return spark.createDataFrame([], "node string, root string"), 0
    for rounds in range(1, max_rounds + 1):
        nxt = _materialize(small_star(large_star(current)), reliable_checkpoint)
        after = _fingerprint(nxt)
        log.info("connected components: round %d, %d edges", rounds, after[0])
        current = nxt
        if after == before:
            break
        before = after
    else:
        raise RuntimeError(f"connected components did not converge in {max_rounds} rounds (raise dedup.max_cc_rounds)")
    nodes = current.select(F.col("src").alias("node"), F.col("dst").alias("root")).unionByName(
        current.select(F.col("dst").alias("node"), F.col("dst").alias("root"))).distinct()
    return nodes, rounds
