"""Materialize a mixture spec at scale: component pools that do not fit one machine become the same
shard sets `python -m mixtures materialize` writes, byte for byte (the engine: kaiyuan/spark/materialize.py).

    spark-submit kaiyuan/jobs/materialize.py --spec mixture.yaml --out shards/ [--sets p2-curriculum,...]
    python -m kaiyuan materialize --spec mixture.yaml --out shards/          (a local session)

`--checkpoint-dir` (default `<work-dir>/checkpoints` when the work directory is on a filesystem)
holds the plan's reliable checkpoints: on a cluster a directory every node reaches (HDFS, the
shared filesystem, or an object store the cluster's Hadoop connector serves: EMRFS s3://, the GCS
connector's gs://), so a lost executor costs a recomputation, not the job.

`--spec` components, `--out` and `--work-dir` may be object-store URLs (s3://, gs://, abfs://):
executors read the components and write the token spill and the shard files there, each set
through the commit protocol (`_attempt-<id>/`, commit record last), so a killed job leaves
nothing a reader sees and its rerun completes it.
"""

from __future__ import annotations

import argparse

from purokit.cli import Command, job_notes


def _args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="output directory: one shard set per phase and order, plus eval")
    ap.add_argument("--sets", default="", help="comma-separated set names (default: all)")
    ap.add_argument("--work-dir", default=None, help="token spill (default: <out>/.work-<hash>-spark)")
    ap.add_argument("--checkpoint-dir", default=None,
                    help="reliable checkpoints of the plan (default: <work-dir>/checkpoints)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--force", action="store_true", help="rewrite sets that are complete")
    ap.add_argument("--master", default=None, help="Spark master when not under spark-submit (default local[*])")
    ap.add_argument("--driver-memory", default=None)
    ap.add_argument("--shuffle-partitions", type=int, default=None)


def _spec(path: str, overrides: list[str]):
    from mixtures.spec import load_spec

    return load_spec(path, overrides)


def materialize(args: argparse.Namespace) -> int:
    """The spec's shard sets on a Spark session (local, or the cluster's under spark-submit)."""
    from purokit import storage
    from kaiyuan.config import SparkConfig
    from kaiyuan.spark.materialize import default_work_dir, resolve_location, run
    from kaiyuan.spark.session import get_session

    spec = args.cfg
    out = resolve_location(args.out)
    work = resolve_location(args.work_dir) if args.work_dir else default_work_dir(spec, out)
    # a store's URL is a checkpoint directory only through a Hadoop connector: asked for, not assumed
    checkpoints = args.checkpoint_dir or (None if storage.is_remote(work) else str(work / "checkpoints"))
    spark = get_session(SparkConfig(master=args.master, driver_memory=args.driver_memory,
                                    shuffle_partitions=args.shuffle_partitions, checkpoint_dir=checkpoints),
                        "kaiyuan-materialize")
    try:
        results = run(spark, spec, out, sets=[s for s in args.sets.split(",") if s] or None, work_dir=work,
                      keep_work=args.keep_work, force=args.force, progress=job_notes())
    finally:
        spark.stop()
    for name, m in results.items():
        print(f"{name}: {m.n_tokens:,} tokens, {m.n_docs:,} docs, {len(m.shards)} shards -> {out / name}")
    return 0


COMMAND = Command(materialize, __doc__.split("\n\n")[0], _args, config=_spec, config_flag="--spec")


if __name__ == "__main__":  # spark-submit: the shared bootstrap runs this job
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).with_name("_submit.py")), {"JOB": Path(__file__).stem}, "__main__")
