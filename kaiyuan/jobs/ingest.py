"""Ingest raw sources (jsonl, jsonl.gz, jsonl.zst, parquet, Hugging Face datasets) into one
component per source under <output>/ingest/, quarantining bad records with their reason and origin.

    spark-submit kaiyuan/jobs/ingest.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.ingest import run_ingest

    return run_ingest(spark, cfg, only)


if __name__ == "__main__":  # spark-submit: the shared bootstrap runs this job
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).with_name("_submit.py")), {"JOB": Path(__file__).stem}, "__main__")
