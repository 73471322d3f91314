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


if __name__ == "__main__":  # spark-submit: the shared bootstrap runs this job
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).with_name("_submit.py")), {"JOB": Path(__file__).stem}, "__main__")
