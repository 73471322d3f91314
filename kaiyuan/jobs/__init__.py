"""Spark job entry points: `spark-submit kaiyuan/jobs/<job>.py --config run.yaml [key=value ...]`,
or `python -m kaiyuan <job> ...`, which starts a local session (`local[*]`, memory sized to the
machine). Each job module has `run(spark, cfg, only) -> {source: ComponentManifest}`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Optional

from purokit import atomic
from purokit.cli import Command, guard
from purokit.config import load_config
from purokit.log import get_logger

JOBS = ("ingest", "dedup", "score", "pipeline")
log = get_logger("kaiyuan.jobs")


def _job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sources", default="", help="comma-separated source names (default: all)")


def _run_config(path: str, overrides: list[str]):
    from kaiyuan.config import RunConfig

    return load_config(RunConfig, path, overrides)


def run_job(job: str, cfg, only: list[str] | None) -> int:
    """Run `job` on `cfg` in a session of `cfg.spark`, then print and write the run's summary."""
    from kaiyuan import report
    from kaiyuan.spark.session import get_session

    module = importlib.import_module(f"kaiyuan.jobs.{job}")
    t0 = time.perf_counter()
    spark = get_session(cfg.spark, f"kaiyuan-{job}")
    try:
        module.run(spark, cfg, only)
    finally:
        spark.stop()
    summary = report.collect(cfg.output)
    atomic.write_json(f"{cfg.output}/summary.json", summary)
    print("\n".join(report.table_lines(summary)))
    log.info("%s finished in %.1fs; summary in %s/summary.json", job, time.perf_counter() - t0, cfg.output)
    return 0


def job_command(job: str) -> Command:
    """The command of a Spark job: `--config run.yaml [--sources a,b] [key=value ...]`."""
    doc = (importlib.import_module(f"kaiyuan.jobs.{job}").__doc__ or "").strip()
    return Command(lambda args: run_job(job, args.cfg, [s for s in args.sources.split(",") if s] or None),
                   doc, _job_args, config=_run_config)


def main(job: str, argv: Optional[list[str]] = None) -> int:
    """`spark-submit kaiyuan/jobs/<job>.py ...` (through `_submit.py`): the job's command under
    the one error policy of every command."""
    from kaiyuan.jobs.materialize import COMMAND as materialize

    command = materialize if job == "materialize" else job_command(job)
    argv = list(sys.argv[1:] if argv is None else argv)
    return guard(f"kaiyuan {job}", command, argv, f"kaiyuan {job}")
