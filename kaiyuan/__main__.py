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

import sys

from purokit.cli import Command, dispatch
from purokit.errors import ContractError
from kaiyuan.jobs import JOBS, job_command


def _classifier_config(path: str, overrides: list[str]):
    from purokit.config import load_config
    from kaiyuan.config import TrainClassifierConfig

    return load_config(TrainClassifierConfig, path, overrides)


def _train_classifier(args) -> int:
    from kaiyuan.classifier import describe_metrics, train_classifier

    card = train_classifier(args.cfg, force=args.force)
    print(f"{args.cfg.name}: {args.cfg.output}")
    for line in describe_metrics(card):
        print("  " + line)
    return 0


def _summary(args) -> int:
    from purokit import storage
    from kaiyuan import report

    if not storage.exists(args.output):
        raise ContractError(args.output, "no such run output directory")
    print("\n".join(report.table_lines(report.collect(args.output))))
    return 0


def _materialize() -> Command:
    from kaiyuan.jobs.materialize import COMMAND

    return COMMAND


COMMANDS = {
    **{job: job_command(job) for job in JOBS},
    "materialize": _materialize(),
    "train-classifier": Command(
        _train_classifier, "Train a fastText quality classifier (positives vs negatives).",
        lambda p: p.add_argument("--force", action="store_true", help="retrain even if the model is up to date"),
        config=_classifier_config),
    "summary": Command(_summary, "the documents in/out per stage and source of a run",
                       lambda p: p.add_argument("output", help="the run's output directory")),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv, prog="python -m kaiyuan")


if __name__ == "__main__":
    sys.exit(main())
