"""Quality annotation of the deduplicated components (datatrove filters, fastText classifiers,
language id, token counts) into <output>/score/; annotates, never drops.

    spark-submit kaiyuan/jobs/score.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.score import run_score

    return run_score(spark, cfg, only)


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

    sys.exit(main("score"))
