"""Ingest raw sources (jsonl, jsonl.gz, jsonl.zst, parquet, Hugging Face datasets) into one
component per source under <output>/ingest/, quarantining bad records with their reason and origin.

    spark-submit kaiyuan/jobs/ingest.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.ingest import run_ingest

    return run_ingest(spark, cfg, only)


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

    sys.exit(main("ingest"))
