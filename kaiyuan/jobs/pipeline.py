"""ingest -> dedup -> score in one Spark application (JVM start-up paid once); each stage still
writes its own components and manifests, and a rerun skips every finished stage.

    spark-submit kaiyuan/jobs/pipeline.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.dedup import run_dedup
    from kaiyuan.spark.ingest import run_ingest
    from kaiyuan.spark.score import run_score

    return {
        "ingest": run_ingest(spark, cfg, only),
        "dedup": run_dedup(spark, cfg, only),
        "score": run_score(spark, cfg, only),
    }


if __name__ == "__main__":
    import sys
    from pathlib import Path

    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]   # no shadowing by job files
    try:
        import kaiyuan  # noqa: F401  (installed, or shipped with --py-files)
    except ImportError:  # a source checkout: use it
        sys.path.insert(0, str(_here.parents[1]))
    from kaiyuan.jobs import main

    sys.exit(main("pipeline"))
