"""Exact and MinHash-LSH near-duplicate removal of the ingested components (within each source by
default), into <output>/dedup/; survivors keep dup_cluster and dup_count.

    spark-submit kaiyuan/jobs/dedup.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.dedup import run_dedup

    return run_dedup(spark, cfg, only)


if __name__ == "__main__":  # spark-submit: the shared bootstrap runs this job
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).with_name("_submit.py")), {"JOB": Path(__file__).stem}, "__main__")
