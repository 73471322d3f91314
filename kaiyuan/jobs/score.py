"""Quality annotation of the deduplicated components (datatrove filters, fastText classifiers,
language id, token counts) into <output>/score/; annotates, never drops.

    spark-submit kaiyuan/jobs/score.py --config run.yaml [key=value ...]"""


def run(spark, cfg, only=None):
    from kaiyuan.spark.score import run_score

    return run_score(spark, cfg, only)


if __name__ == "__main__":  # spark-submit: the shared bootstrap runs this job
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).with_name("_submit.py")), {"JOB": Path(__file__).stem}, "__main__")
