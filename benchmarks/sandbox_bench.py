"""Sandbox benchmark: the cost of one verdict of `purokit.sandbox.run_python` beside its anchors.

    .venv/bin/python benchmarks/sandbox_bench.py [--n 30] [--before 044b5a5]

Measured in the same run, interleaved (one of each per round, so load on a shared machine hits all
alike), on a trivial solution plus one assert:
- `bare`: a bare `python -I -c pass` subprocess (the floor: one interpreter start);
- `before`: the sandbox as it was at commit `--before` (rlimits, audit hook, `unshare -n`), loaded
  from git, so "today's" cost is re-measured here rather than quoted;
- `namespaces`: the sandbox now (bubblewrap: mount, PID, network, IPC and UTS namespaces, own uid,
  RLIMIT_NPROC, nonce sentinel, audit hook);
- `fallback`: the sandbox now with namespaces unavailable (rlimits, audit hook, `unshare -n`).
Reported: median and mean ms per verdict, and the ratios the issue asks for (now / before, now /
bare). Ratios are what to read; the load average is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from purokit import sandbox  # noqa: E402

CODE, TESTS = "def f(x):\n    return x + 1\n", "assert f(1) == 2"


def load_before(commit: str):
    """The sandbox as of `commit` (in the shared package, named `common` before issue 36 and `purokit`
    after), imported as a separate module."""
    for package in ("common", "purokit"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{package}/sandbox.py"], capture_output=True,
                               text=True)
        if shown.returncode == 0:
            break
    shown.check_returncode()
    src = shown.stdout
    path = Path(tempfile.mkdtemp(prefix="sandbox-before-")) / "sandbox_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("sandbox_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--before", default="044b5a5", help="commit whose sandbox is the 'today' anchor")
    args = ap.parse_args()
    before = load_before(args.before)
    limits_now = sandbox.SandboxLimits(timeout_s=10, memory_mb=512)
    limits_before = before.SandboxLimits(timeout_s=10, memory_mb=512)
    status = sandbox.isolation_status()
    if status["mode"] != "namespaces":
        raise SystemExit(f"namespaces unavailable here ({status['reason']}): install bubblewrap to benchmark them")

    def bare() -> None:
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)

    def now() -> None:
        v = sandbox.run_python(CODE, TESTS, limits=limits_now)
        assert v.passed and v.isolation == "namespaces", v

    def old() -> None:
        v = before.run_python(CODE, TESTS, limits=limits_before)
        assert v.passed, v

    real_problem = sandbox._namespaces_problem

    def fallback() -> None:
        sandbox._namespaces_problem = lambda python: "disabled by the benchmark"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", sandbox.SandboxIsolationWarning)
                v = sandbox.run_python(CODE, TESTS, limits=limits_now)
        finally:
            sandbox._namespaces_problem = real_problem
        assert v.passed and v.isolation != "namespaces", v

    cases = {"bare": bare, "before": old, "namespaces": now, "fallback": fallback}
    for fn in cases.values():          # warm caches (probe, interpreter paths, page cache)
        fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.n):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    ms = {k: {"median_ms": round(1000 * statistics.median(v), 1), "mean_ms": round(1000 * statistics.mean(v), 1)}
          for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"n": args.n, "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "isolation": status,
           "before_commit": args.before, "per_verdict": ms,
           "ratio_namespaces_to_before": round(med["namespaces"] / med["before"], 2),
           "ratio_namespaces_to_bare": round(med["namespaces"] / med["bare"], 2),
           "ratio_fallback_to_before": round(med["fallback"] / med["before"], 2)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
