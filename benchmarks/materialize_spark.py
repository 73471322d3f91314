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
4. whether both paths wrote the same set (its content digest).

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
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.materialize_local import make_pool, spec_for  # noqa: E402


class PeakMemory:
    """Peak RSS (MB) of a process tree, split into the driver's Python process, the driver JVM
    (SparkSubmit) and the executors (CoarseGrainedExecutorBackend), sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.root = psutil.Process(pid)
        self.peak = {"driver_python": 0.0, "driver_jvm": 0.0, "executors": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
        self._thread.start()

    def _sample(self, interval_s: float) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
                executors = 0.0
                for p in procs:
                    rss = p.memory_info().rss / 2**20
                    cmd = " ".join(p.cmdline())
                    if p.pid == self.root.pid:
                        self.peak["driver_python"] = max(self.peak["driver_python"], rss)
                    elif "CoarseGrainedExecutorBackend" in cmd:
                        executors += rss
                    elif "SparkSubmit" in cmd:
                        self.peak["driver_jvm"] = max(self.peak["driver_jvm"], rss)
                self.peak["executors"] = max(self.peak["executors"], executors)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
            self._stop.wait(interval_s)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peak


def timed(cmd: list[str], env: dict[str, str], memory: bool = False) -> tuple[float, str, dict[str, float]]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    sampler = PeakMemory(proc.pid) if memory else None
    out, err = proc.communicate()
    dt = time.perf_counter() - t0
    peak = sampler.stop() if sampler else {}
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return dt, out, peak


def set_digest(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["set_digest"]


def n_tokens(path: Path) -> int:
    return json.loads((path / "manifest.json").read_text())["n_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000, help="web documents in the 1x pool (math, code: half)")
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--master", default="local-cluster[2,1,1024]")
    ap.add_argument("--driver-memory", default="1g")
    args = ap.parse_args()
    from common.component import Component
    from mixtures.tokenizers import train_bpe

    workers, per_worker = map(int, re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*\d+\]", args.master).groups())
    cores = workers * per_worker
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    print(f"cores {os.cpu_count()}, Spark master {args.master} ({cores} executor cores), driver memory "
          f"{args.driver_memory}, load average at start {os.getloadavg()[0]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="bench-materialize-spark-"))
    sizes = [int(s) for s in args.sizes.split(",")]
    pools = {s: make_pool(work / f"pool{s}", args.docs * s, seed=s) for s in sizes}
    base = pools[sizes[0]]
    sample = (t for c in base.values() for t in Component.open(c).read(["text"]).column("text").to_pylist()[:1500])
    train_bpe(sample, args.vocab, work / "tok")
    rows = []
    for s in sizes:
        spec = work / f"spec{s}.yaml"
        spec.write_text(yaml.safe_dump(spec_for(pools[s], work / "tok" / "tokenizer.json")))
        load0 = os.getloadavg()[0]
        dt_local, _, _ = timed([sys.executable, "-m", "mixtures", "materialize", "--spec", str(spec), "--out",
                                str(work / f"local{s}"), "--force"], env)
        dt_spark, out, peak = timed([sys.executable, "-m", "kaiyuan", "materialize", "--spec", str(spec), "--out",
                                     str(work / f"spark{s}"), "--force", "--master", args.master,
                                     "--driver-memory", args.driver_memory], env, memory=True)
        n = n_tokens(work / f"local{s}" / "p-uniform")
        same = set_digest(work / f"local{s}" / "p-uniform") == set_digest(work / f"spark{s}" / "p-uniform")
        n_docs = sum(Component.open(c).manifest.n_docs for c in pools[s].values())
        row = {"size": s, "docs": n_docs, "tokens": n, "local_s": dt_local, "spark_s": dt_spark,
               "local_tps": n / dt_local, "spark_tps": n / dt_spark, "spark_tps_per_core": n / dt_spark / cores,
               "per_core_ratio": (n / dt_spark / cores) / (n / dt_local), "same": same,
               "load": (load0, os.getloadavg()[0]), **{f"peak_{k}_mb": v for k, v in peak.items()}}
        rows.append(row)
        print(f"RESULT pool {s}x: {n_docs:,} docs, {n:,} tokens; local {row['local_tps']:,.0f} tokens/s "
              f"({dt_local:.1f}s); spark {row['spark_tps']:,.0f} tokens/s ({dt_spark:.1f}s) = "
              f"{row['spark_tps_per_core']:,.0f} per executor core = {100 * row['per_core_ratio']:.0f}% of local "
              f"per core; driver peak RSS python {peak['driver_python']:.0f} MB + JVM {peak['driver_jvm']:.0f} MB "
              f"(executors {peak['executors']:.0f} MB); same set: {same}; load {load0:.1f} -> {os.getloadavg()[0]:.1f}",
              flush=True)
    print(json.dumps(rows))
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
