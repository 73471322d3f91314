"""`python -m kaiyuan <command> ...`

  ingest | dedup | score | pipeline   --config run.yaml [--sources a,b] [key=value ...]
        the Spark jobs, in a local session (local[*], memory sized to the machine); the same
        jobs run on a cluster with `spark-submit kaiyuan/jobs/<job>.py --config run.yaml`
  materialize --spec mixture.yaml --out shards/ [--sets a,b] [--checkpoint-dir DIR] [key=value ...]
        a mixture spec's shard sets on Spark (byte-identical to `python -m mixtures materialize`);
        on a cluster: `spark-submit kaiyuan/jobs/materialize.py --spec ... --out ...`
  train-classifier --config classifier.yaml [key=value ...] [--force]
        a fastText quality classifier from positive and negative text; prints held-out metrics
  summary <output dir>
        the table of documents in/out per stage and source, clusters, filter pass rates
"""

from __future__ import annotations

import argparse
import importlib
import sys

from common.cli import dispatch
from kaiyuan.jobs import JOBS


def _train_classifier(argv: list[str]) -> int:
    from common.config import load_config
    from common.errors import ContractError
    from kaiyuan.classifier import describe_metrics, train_classifier
    from kaiyuan.config import TrainClassifierConfig

    ap = argparse.ArgumentParser(prog="kaiyuan train-classifier",
                                 description="Train a fastText quality classifier (positives vs negatives).")
    ap.add_argument("--config", required=True)
    ap.add_argument("--force", action="store_true", help="retrain even if the model is up to date")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(TrainClassifierConfig, args.config, args.overrides)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    card = train_classifier(cfg, force=args.force)
    print(f"{cfg.name}: {cfg.output}")
    for line in describe_metrics(card):
        print("  " + line)
    return 0


def _summary(argv: list[str]) -> int:
    from kaiyuan import report

    ap = argparse.ArgumentParser(prog="kaiyuan summary")
    ap.add_argument("output", help="the run's output directory")
    args = ap.parse_args(argv)
    print("\n".join(report.table_lines(report.collect(args.output))))
    return 0


def _job(name: str):
    return lambda rest: importlib.import_module("kaiyuan.jobs").main(name, rest)


def main(argv: list[str] | None = None) -> int:
    commands = {**{job: _job(job) for job in JOBS},
                "materialize": lambda rest: importlib.import_module("kaiyuan.jobs.materialize").main(rest),
                "train-classifier": _train_classifier, "summary": _summary}
    return dispatch(__doc__, commands, argv, errors=())


if __name__ == "__main__":
    sys.exit(main())
