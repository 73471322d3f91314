"""Does the Spark materialization path scale? (issues 17 and 34)

    .venv/bin/python benchmarks/materialize_spark.py [--docs 500] [--sizes 16,64,256] [--master local-cluster[2,1,1024]]

For pools of 16x, 64x and 256x the size (the pool of benchmarks/materialize_local.py: three
components of Zipf-distributed words, 1x = `--docs` web documents plus half as many math and code;
with --docs 500, 256x is ~1.05 x 10^8 tokens), in one run, each size alternating:

1. the local path as users run it: `python -m mixtures materialize --spec ... --out ... --force`
   (one process, TOKENIZERS_PARALLELISM=false: one core), tokens/s;
2. the Spark path as users run it: `python -m kaiyuan materialize --spec ... --out ... --force
   --master local-cluster[2,1,1024]` (real Spark: a driver JVM and two executor JVMs of one core
   each, reliable checkpoints in the work directory), tokens/s and tokens/s per executor core;
3. peak resident memory of the Spark driver (its Python process and its JVM, sampled every
   0.2 s), which must stay flat as the pool grows (no document row reaches the driver);
4. CPU seconds of each path's whole process tree (tokens per CPU second: what the load of a
   shared machine does not change; under load, several Spark processes also get a larger share
   of the cores than one local process, which flatters Spark's wall-clock figure);
5. shuffle bytes read and written by the Spark run (its event log);
6. whether both paths wrote the same set (its content digest);
7. the marginal CPU cost per token between the two largest sizes, for each path.

Targets (issue 34): at the largest size Spark tokens/s per executor core >= 50% of the local
path's; marginal CPU s per token <= 1.25x local's; driver memory within 25% across sizes. Rows go
to `--json` (default benchmarks/results/materialize_spark.json) as each size finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.materialize_local import make_pools, spec_for  # noqa: E402


class TreeSampler:
    """Samples a process tree every `interval_s`: peak RSS (MB) of the driver's Python process, the
    driver JVM (SparkSubmit) and the executors (CoarseGrainedExecutorBackend) together, and the CPU
    seconds of every process in the tree (the last sample of each; what runs after it is lost, at
    most `interval_s` per process). CPU seconds do not depend on the machine's load."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.root = psutil.Process(pid)
        self.peak = {"driver_python": 0.0, "driver_jvm": 0.0, "executors": 0.0}
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
        self._thread.start()

    def _sample(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.NoSuchProcess:
                procs = []
            executors = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system
                    rss = p.memory_info().rss / 2**20
                    cmd = " ".join(p.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                if p.pid == self.root.pid:
                    self.peak["driver_python"] = max(self.peak["driver_python"], rss)
                elif "CoarseGrainedExecutorBackend" in cmd:
                    executors += rss
                elif "SparkSubmit" in cmd:
                    self.peak["driver_jvm"] = max(self.peak["driver_jvm"], rss)
            self.peak["executors"] = max(self.peak["executors"], executors)
            self._stop.wait(interval_s)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {**{f"peak_{k}_mb": v for k, v in self.peak.items()}, "cpu_s": sum(self.cpu.values())}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """Run a command to completion: (wall seconds, TreeSampler figures)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    sampler = TreeSampler(proc.pid)
    _, err = proc.communicate()
    dt = time.perf_counter() - t0
    figures = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return dt, figures


def shuffle_mb(event_dir: Path) -> tuple[float, float]:
    """Shuffle MB read and written by every task of the Spark run logged in `event_dir`."""
    from benchmarks.profile_materialize_spark import stage_table

    stages = stage_table(event_dir)
    return sum(s["shuffle_read_mb"] for s in stages), sum(s["shuffle_write_mb"] for s in stages)


def marginal(rows: list[dict]) -> dict | None:
    """CPU seconds per million tokens between the two largest sizes, for each path."""
    if len(rows) < 2:
        return None
    a, b = rows[-2], rows[-1]
    dt = b["tokens"] - a["tokens"]
    local, spark = ((b[k] - a[k]) / dt * 1e6 for k in ("local_cpu_s", "spark_cpu_s"))
    return {"between": [a["tokens"], b["tokens"]], "local_cpu_s_per_mtoken": local, "spark_cpu_s_per_mtoken": spark,
            "spark_over_local": spark / local}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=500, help="web documents in the 1x pool (math, code: half)")
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--driver-memory", default="1g")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "materialize_spark.json"))
    args = ap.parse_args()
    from purokit.component import Component
    from mixtures.shards import ShardManifest

    workers, per_worker = map(int, re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", args.master).groups())
    cores = workers * per_worker
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    print(f"cores {os.cpu_count()}, Spark master {args.master} ({cores} executor cores), driver memory "
          f"{args.driver_memory}, load average at start {os.getloadavg()[0]:.2f}", flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    work, pools, tok_json = make_pools("bench-materialize-spark-", args.docs, sizes, args.vocab)
    print(f"pools generated in {work}", flush=True)
    rows = []
    for s in sizes:
        spec = work / f"spec{s}.yaml"
        spec.write_text(yaml.safe_dump(spec_for(pools[s], tok_json)))
        events = work / f"events{s}"
        events.mkdir()
        spark_env = dict(env, PYSPARK_SUBMIT_ARGS=f"--conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
                                                  f"--conf spark.eventLog.dir=file://{events} pyspark-shell")
        load0 = os.getloadavg()[0]
        dt_local, local_fig = timed([sys.executable, "-m", "mixtures", "materialize", "--spec", str(spec), "--out",
                                     str(work / f"local{s}"), "--force"], env)
        dt_spark, spark_fig = timed([sys.executable, "-m", "kaiyuan", "materialize", "--spec", str(spec), "--out",
                                     str(work / f"spark{s}"), "--force", "--master", args.master,
                                     "--driver-memory", args.driver_memory], spark_env)
        local, spark = (ShardManifest.read(work / f"{e}{s}" / "p-uniform") for e in ("local", "spark"))
        n = local.n_tokens
        n_docs = sum(Component.open(c).manifest.n_docs for c in pools[s].values())
        read_mb, written_mb = shuffle_mb(events)
        row = {"size": s, "docs": n_docs, "tokens": n, "local_tokens_per_s": n / dt_local,
               "spark_tokens_per_s_per_core": n / dt_spark / cores, "local_cpu_s": local_fig["cpu_s"],
               "spark_cpu_s": spark_fig["cpu_s"],
               "driver_peak_mb": spark_fig["peak_driver_python_mb"] + spark_fig["peak_driver_jvm_mb"],
               "local_s": dt_local, "spark_s": dt_spark, "local_tokens_per_cpu_s": n / local_fig["cpu_s"],
               "spark_tokens_per_cpu_s": n / spark_fig["cpu_s"], "shuffle_read_mb": read_mb,
               "shuffle_write_mb": written_mb, "same_set": local.set_digest == spark.set_digest,
               "load": [load0, os.getloadavg()[0]], **{k: v for k, v in spark_fig.items() if k.startswith("peak_")}}
        rows.append(row)
        for d in (work / f"local{s}", work / f"spark{s}"):
            shutil.rmtree(d, ignore_errors=True)
        print(f"RESULT pool {s}x: {n_docs:,} docs, {n:,} tokens; local {row['local_tokens_per_s']:,.0f} tokens/s "
              f"({dt_local:.1f}s, {local_fig['cpu_s']:.1f} CPU s); spark {n / dt_spark:,.0f} tokens/s ({dt_spark:.1f}s, "
              f"{spark_fig['cpu_s']:.1f} CPU s) = {row['spark_tokens_per_s_per_core']:,.0f} per executor core = "
              f"{100 * row['spark_tokens_per_s_per_core'] / row['local_tokens_per_s']:.0f}% of local per core; per CPU "
              f"second {row['spark_tokens_per_cpu_s']:,.0f} vs {row['local_tokens_per_cpu_s']:,.0f} tokens = "
              f"{100 * row['spark_tokens_per_cpu_s'] / row['local_tokens_per_cpu_s']:.0f}%; driver peak RSS python "
              f"{row['peak_driver_python_mb']:.0f} MB + JVM {row['peak_driver_jvm_mb']:.0f} MB (executors "
              f"{row['peak_executors_mb']:.0f} MB); shuffle read {read_mb:.1f} MB, written {written_mb:.1f} MB; "
              f"same set: {row['same_set']}; load {load0:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
        result = {"command": " ".join(sys.argv), "master": args.master, "executor_cores": cores, "rows": rows,
                  "marginal": marginal(rows)}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"MARGINAL {json.dumps(result['marginal'])}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
