"""Does the Spark materialization path scale? (issue 17)

    .venv/bin/python benchmarks/materialize_spark.py [--docs 3000] [--sizes 1,4,16] [--master local-cluster[2,1,1024]]

For pools of 1x, 4x and 16x the size (the pool of benchmarks/materialize_local.py: three
components of Zipf-distributed words, 1x = `--docs` web documents plus half as many math and code),
in one run, each size alternating:

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
5. whether both paths wrote the same set (its content digest).

The target is Spark per-core throughput >= 50% of the local path's at 16x. The machine is shared:
the load average is printed with every row, and only ratios measured side by side are meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000, help="web documents in the 1x pool (math, code: half)")
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--driver-memory", default="1g")
    args = ap.parse_args()
    from common.component import Component
    from mixtures.shards import ShardManifest

    workers, per_worker = map(int, re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", args.master).groups())
    cores = workers * per_worker
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    print(f"cores {os.cpu_count()}, Spark master {args.master} ({cores} executor cores), driver memory "
          f"{args.driver_memory}, load average at start {os.getloadavg()[0]:.2f}")
    sizes = [int(s) for s in args.sizes.split(",")]
    work, pools, tok_json = make_pools("bench-materialize-spark-", args.docs, sizes, args.vocab)
    rows = []
    for s in sizes:
        spec = work / f"spec{s}.yaml"
        spec.write_text(yaml.safe_dump(spec_for(pools[s], tok_json)))
        load0 = os.getloadavg()[0]
        dt_local, local_fig = timed([sys.executable, "-m", "mixtures", "materialize", "--spec", str(spec), "--out",
                                     str(work / f"local{s}"), "--force"], env)
        dt_spark, spark_fig = timed([sys.executable, "-m", "kaiyuan", "materialize", "--spec", str(spec), "--out",
                                     str(work / f"spark{s}"), "--force", "--master", args.master,
                                     "--driver-memory", args.driver_memory], env)
        local, spark = (ShardManifest.read(work / f"{e}{s}" / "p-uniform") for e in ("local", "spark"))
        n = local.n_tokens
        n_docs = sum(Component.open(c).manifest.n_docs for c in pools[s].values())
        row = {"size": s, "docs": n_docs, "tokens": n, "local_s": dt_local, "spark_s": dt_spark,
               "local_tps": n / dt_local, "spark_tps_per_core": n / dt_spark / cores,
               "local_tokens_per_cpu_s": n / local_fig["cpu_s"], "spark_tokens_per_cpu_s": n / spark_fig["cpu_s"],
               "same_set": local.set_digest == spark.set_digest, "load": [load0, os.getloadavg()[0]],
               **{k: v for k, v in spark_fig.items() if k.startswith("peak_")}}
        rows.append(row)
        print(f"RESULT pool {s}x: {n_docs:,} docs, {n:,} tokens; local {row['local_tps']:,.0f} tokens/s ({dt_local:.1f}s, "
              f"{local_fig['cpu_s']:.1f} CPU s); spark {n / dt_spark:,.0f} tokens/s ({dt_spark:.1f}s, "
              f"{spark_fig['cpu_s']:.1f} CPU s) = {row['spark_tps_per_core']:,.0f} per executor core = "
              f"{100 * row['spark_tps_per_core'] / row['local_tps']:.0f}% of local per core; per CPU second "
              f"{row['spark_tokens_per_cpu_s']:,.0f} vs {row['local_tokens_per_cpu_s']:,.0f} tokens = "
              f"{100 * row['spark_tokens_per_cpu_s'] / row['local_tokens_per_cpu_s']:.0f}%; driver peak RSS python "
              f"{row['peak_driver_python_mb']:.0f} MB + JVM {row['peak_driver_jvm_mb']:.0f} MB (executors "
              f"{row['peak_executors_mb']:.0f} MB); same set: {row['same_set']}; load {load0:.1f} -> "
              f"{os.getloadavg()[0]:.1f}", flush=True)
    print(json.dumps(rows))
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
