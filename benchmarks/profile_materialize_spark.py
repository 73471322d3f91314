"""Where the Spark materialization spends its time (issue 34).

    .venv/bin/python benchmarks/profile_materialize_spark.py [--docs 500] [--size 16] [--master local-cluster[2,1,1024]]

One pool of `--size` x (benchmarks/materialize_local.py's pool), materialized once by each path as
users run it:

1. the local path, `python -m cProfile -m mixtures materialize ...` (the anchor);
2. the Spark path, `python -m cProfile -m kaiyuan materialize ... --master local-cluster[...]` with
   - the executors' Python workers profiled: PUROKIT_UDF_PROFILE_DIR makes every mapInPandas /
     mapInArrow function of kaiyuan/spark/materialize.py run under cProfile (one file per task);
   - Spark's event log on: per stage (named by its Python call site) tasks, executor run time, JVM
     CPU time, shuffle bytes read and written.

Prints the stage table, the workers' top functions (summed over tasks), the driver's top
functions and the local path's, and each process tree's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
from collections import defaultdict
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.materialize_local import make_pools, spec_for  # noqa: E402
from benchmarks.materialize_spark import timed  # noqa: E402


def stage_table(event_dir: Path) -> list[dict]:
    """Per stage: name, tasks, executor run s, JVM CPU s, shuffle MB read/written (event log)."""
    names, stats = {}, defaultdict(lambda: defaultdict(float))
    for log in event_dir.rglob("events_*"):
        for line in log.read_text().splitlines():
            e = json.loads(line)
            if e["Event"] == "SparkListenerStageCompleted":
                names[e["Stage Info"]["Stage ID"]] = e["Stage Info"]["Stage Name"]
            elif e["Event"] == "SparkListenerTaskEnd" and e.get("Task Metrics"):
                m, s = e["Task Metrics"], stats[e["Stage ID"]]
                s["tasks"] += 1
                s["run_s"] += m["Executor Run Time"] / 1e3
                s["jvm_cpu_s"] += m["Executor CPU Time"] / 1e9
                r = m.get("Shuffle Read Metrics", {})
                s["shuffle_read_mb"] += (r.get("Remote Bytes Read", 0) + r.get("Local Bytes Read", 0)) / 2**20
                s["shuffle_write_mb"] += m.get("Shuffle Write Metrics", {}).get("Shuffle Bytes Written", 0) / 2**20
    return [{"stage": k, "name": names.get(k, "?"), **v} for k, v in sorted(stats.items())]


def top(stats: pstats.Stats, key: str, n: int) -> list[str]:
    """The n entries with most `key` ('tottime' or 'cumulative') as 'seconds  function' lines."""
    idx = 2 if key == "tottime" else 3
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][idx])[:n]
    return [f"{v[idx]:8.2f}s  {Path(f).name}:{line}({fn})" for (f, line, fn), v in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=500)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    work, pools, tok_json = make_pools("profile-materialize-spark-", args.docs, [args.size], args.vocab)
    spec = work / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_for(pools[args.size], tok_json)))
    udf_dir, event_dir = work / "udf-prof", work / "events"
    udf_dir.mkdir()
    event_dir.mkdir()
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    print(f"work {work}, load average {os.getloadavg()[0]:.2f}", flush=True)
    dt_local, f_local = timed([sys.executable, "-m", "cProfile", "-o", str(work / "local.prof"), "-m", "mixtures",
                               "materialize", "--spec", str(spec), "--out", str(work / "local"), "--force"], env)
    spark_env = dict(env, PUROKIT_UDF_PROFILE_DIR=str(udf_dir), PYSPARK_SUBMIT_ARGS=(
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
        f"--conf spark.eventLog.dir=file://{event_dir} pyspark-shell"))
    dt_spark, f_spark = timed([sys.executable, "-m", "cProfile", "-o", str(work / "driver.prof"), "-m", "kaiyuan",
                               "materialize", "--spec", str(spec), "--out", str(work / "spark"), "--force",
                               "--master", args.master, "--driver-memory", "1g"], env=spark_env)
    print(f"local: {dt_local:.1f}s wall, {f_local['cpu_s']:.1f} CPU s (process tree); spark: {dt_spark:.1f}s wall, "
          f"{f_spark['cpu_s']:.1f} CPU s (driver + executors + Python workers)")
    report(work, args.top)


def report(work: Path, n_top: int) -> None:
    """The stage table and the profiles of a finished run in `work`."""
    udf_dir, event_dir = work / "udf-prof", work / "events"
    stages = stage_table(event_dir)
    print(f"\nSpark stages ({len(stages)}): run s = executor run time summed over tasks, JVM CPU s excludes "
          f"Python workers")
    print(f"{'run s':>8} {'JVM CPU':>8} {'tasks':>5} {'shuf R MB':>9} {'shuf W MB':>9}  stage")
    for s in sorted(stages, key=lambda s: -s["run_s"]):
        print(f"{s['run_s']:8.1f} {s['jvm_cpu_s']:8.1f} {int(s['tasks']):5d} {s['shuffle_read_mb']:9.1f} "
              f"{s['shuffle_write_mb']:9.1f}  {s['name']}")
    tot = {k: sum(s[k] for s in stages) for k in ("run_s", "jvm_cpu_s", "shuffle_read_mb", "shuffle_write_mb")}
    print(f"{tot['run_s']:8.1f} {tot['jvm_cpu_s']:8.1f} {'':5} {tot['shuffle_read_mb']:9.1f} "
          f"{tot['shuffle_write_mb']:9.1f}  TOTAL")
    files = sorted(udf_dir.glob("*.prof"))
    by_fn = defaultdict(float)
    for f in files:
        st = pstats.Stats(str(f))
        by_fn[f.name.rsplit("-", 1)[0]] += st.total_tt
    print(f"\nexecutors' Python workers: {len(files)} task profiles, {sum(by_fn.values()):.1f}s in UDFs")
    for k, v in sorted(by_fn.items(), key=lambda kv: -kv[1]):
        print(f"{v:8.2f}s  {k}")
    if files:
        st = pstats.Stats(*[str(f) for f in files])
        print("\nworkers, top by own time:")
        print("\n".join(top(st, "tottime", n_top)))
        print("\nworkers, top by cumulative time:")
        print("\n".join(top(st, "cumulative", n_top)))
    for name in ("driver", "local"):
        st = pstats.Stats(str(work / f"{name}.prof"))
        print(f"\n{name} process ({st.total_tt:.1f}s profiled), top by own time:")
        print("\n".join(top(st, "tottime", n_top)))


if __name__ == "__main__":
    main()
