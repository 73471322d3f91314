"""Spark job entry points: `spark-submit kaiyuan/jobs/<job>.py --config run.yaml [key=value ...]`,
or `python -m kaiyuan <job> ...`, which starts a local session (`local[*]`, memory sized to the
machine). Each job module has `run(spark, cfg, only) -> {source: ComponentManifest}`."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from typing import Optional

from common import atomic
from common.config import load_config
from common.errors import ContractError
from common.log import get_logger

JOBS = ("ingest", "dedup", "score", "pipeline")
log = get_logger("kaiyuan.jobs")


def parse_args(job: str, argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=f"kaiyuan {job}", description=(importlib.import_module(f"kaiyuan.jobs.{job}").__doc__ or "").strip())
    ap.add_argument("--config", required=True, help="the run's YAML file")
    ap.add_argument("--sources", default="", help="comma-separated source names (default: all)")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    return ap.parse_args(argv)


def main(job: str, argv: Optional[list[str]] = None) -> int:
    from kaiyuan import report
    from kaiyuan.config import RunConfig
    from kaiyuan.spark.session import get_session

    args = parse_args(job, list(sys.argv[1:] if argv is None else argv))
    try:
        cfg = load_config(RunConfig, args.config, args.overrides)
    except ContractError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    only = [s for s in args.sources.split(",") if s] or None
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
