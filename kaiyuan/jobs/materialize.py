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
import importlib.util
import sys
from pathlib import Path

if __name__ == "__main__":  # spark-submit runs this file directly: find the package
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    if importlib.util.find_spec("kaiyuan") is None:
        sys.path.insert(0, str(_here.parents[1]))

from common import storage  # noqa: E402
from common.errors import ContractError  # noqa: E402
from kaiyuan.config import SparkConfig  # noqa: E402
from kaiyuan.spark.materialize import default_work_dir, resolve_location, run  # noqa: E402
from kaiyuan.spark.session import get_session  # noqa: E402
from mixtures.spec import load_spec  # noqa: E402


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(prog="kaiyuan materialize", description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="the mixture spec (YAML)")
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
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the spec")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_spec(args.spec, args.overrides)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = resolve_location(args.out)
    work = resolve_location(args.work_dir) if args.work_dir else default_work_dir(spec, out)
    # a store's URL is a checkpoint directory only through a Hadoop connector: asked for, not assumed
    checkpoints = args.checkpoint_dir or (None if storage.is_remote(work) else str(work / "checkpoints"))
    spark = get_session(SparkConfig(master=args.master, driver_memory=args.driver_memory,
                                    shuffle_partitions=args.shuffle_partitions, checkpoint_dir=checkpoints),
                        "kaiyuan-materialize")
    try:
        results = run(spark, spec, out, sets=[s for s in args.sets.split(",") if s] or None, work_dir=work,
                      keep_work=args.keep_work, force=args.force, progress=print)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    for name, m in results.items():
        print(f"{name}: {m.n_tokens:,} tokens, {m.n_docs:,} docs, {len(m.shards)} shards -> {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
