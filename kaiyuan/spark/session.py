"""Spark sessions for kaiyuan's jobs.

Under `spark-submit` the session already has its master, memory and `--conf` settings from the
command line; kaiyuan only fills in defaults the user did not set. Started by `python -m kaiyuan`,
it is `local[*]` with driver memory sized to the machine.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from purokit.log import get_logger
from kaiyuan.config import SparkConfig

log = get_logger("kaiyuan.spark")


def under_spark_submit() -> bool:
    """True when this Python process was launched by spark-submit (its JVM gateway is running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def machine_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def default_driver_memory(total_bytes: Optional[int] = None) -> str:
    """40% of the machine's memory, between 1g and 32g (the driver is also the executor in local mode)."""
    total = total_bytes if total_bytes is not None else machine_memory_bytes()
    gib = int(total * 0.4 / 2**30)
    return f"{max(1, min(32, gib))}g"


def default_confs(cores: int, cfg: SparkConfig) -> dict[str, str]:
    confs = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.compression.codec": "zstd",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "4096",
        "spark.python.worker.reuse": "true",
        # progress comes from our log lines; Spark's own stays at WARN
        "spark.log.level": cfg.log_level,
    }
    if cfg.shuffle_partitions or cores:
        confs["spark.sql.shuffle.partitions"] = str(cfg.shuffle_partitions or max(4, 2 * cores))
    return confs


def get_session(cfg: SparkConfig, app_name: str):
    """A SparkSession for a kaiyuan job (see the module docstring for where settings come from)."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    conf = SparkConf()
    submitted = under_spark_submit()
    if not submitted:
        # Python workers must run this interpreter (with its packages), not whatever python3 is on PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        cores = os.cpu_count() or 1
        conf.setMaster(cfg.master or "local[*]")
        conf.set("spark.driver.memory", cfg.driver_memory or default_driver_memory())
    else:
        cores = 0
    conf.setAppName(app_name)
    if cfg.checkpoint_dir:
        conf.set("spark.checkpoint.dir", cfg.checkpoint_dir)
    for k, v in cfg.conf.items():
        conf.set(k, str(v))
    if submitted:
        # spark.default.parallelism is only known once the context exists; estimate from the master
        master = conf.get("spark.master", "local[*]")
        cores = _cores_of_master(master)
    for k, v in default_confs(cores, cfg).items():
        if not conf.contains(k):
            conf.set(k, v)
    if cfg.shuffle_partitions:          # set explicitly in the run config: it wins
        conf.set("spark.sql.shuffle.partitions", str(cfg.shuffle_partitions))
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel(cfg.log_level)
    if cfg.checkpoint_dir:
        spark.sparkContext.setCheckpointDir(cfg.checkpoint_dir)
    log.info("Spark %s, master %s, %d default partitions", spark.version, spark.sparkContext.master,
             spark.sparkContext.defaultParallelism)
    return spark


def _cores_of_master(master: str) -> int:
    """Cores implied by a master URL (local[N], local[*], local-cluster[W,C,M]); 2 otherwise."""
    import re

    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if m:
        return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))
    m = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", master)
    if m:
        return int(m.group(1)) * int(m.group(2))
    if master == "local":
        return 1
    return 0          # a cluster: leave the shuffle partitions to Spark or the user
