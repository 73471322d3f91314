"""proxy_eval plan benchmark: the streaming slice plan at 10^6 and 10^7 documents, beside the
in-memory selection, peak memory and wall time of each.

    .venv/bin/python benchmarks/proxy_plan_bench.py [--docs 1000000,10000000] [--work DIR]

For each size a scored component is written (10 parquet files; ids `web-<n>`, a one-word text,
n_tokens 20-2000, integer-valued scores 0-99 so that ties are common, 5% without a score), then:
1. product path: `python -m proxy_eval plan --config plan.yaml` (four quantile slices of 1% of
   the tokens each, written as components), in a subprocess; peak RSS from the kernel
   (`ru_maxrss` of the child) and wall time;
2. peer, same run: the same selection held in memory (every id, token count and score of the
   component read into Python/numpy, then `proxy_eval.slices.select_slices`) in a subprocess,
   its peak RSS and time, and a check that both chose the same documents.
Flat memory means the streaming plan's peak does not grow with the number of documents. The
imports alone are measured first (the CLI loads every command's modules: torch, transformers,
datasets), so the growth above them is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from purokit.component import Component, finalize_component  # noqa: E402
from purokit.document import BASE_SCHEMA  # noqa: E402

IN_MEMORY = r"""
import json, sys, time
import numpy as np, pyarrow as pa, pyarrow.compute as pc
from purokit.component import Component
from proxy_eval.plan import PlanConfig
from proxy_eval.slices import decide_component, select_slices
cfg = PlanConfig.model_validate(json.loads(sys.argv[1]))
t0 = time.perf_counter()
comp = Component.open(cfg.components[0].path)
table = comp.read(columns=["id", "n_tokens", "quality.hq"])
ids = table.column("id").to_pylist()
toks = table.column("n_tokens").to_numpy()
scores = pc.cast(table.column("quality.hq"), pa.float64()).to_numpy(zero_copy_only=False)
d = decide_component("web", int(toks.sum()), True, cfg.rules, score_field="quality.hq")
sels = select_slices(d, ids, toks, scores)
print(json.dumps({"wall_s": time.perf_counter() - t0,
                  "slices": {s.spec.name: [int(len(s.rows)), int(s.n_tokens)] for s in sels}}))
"""


def make_component(root: Path, n: int, files: int = 10, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tmp = root / ".build-web"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    schema = pa.schema(list(BASE_SCHEMA) + [pa.field("n_tokens", pa.int64()), pa.field("quality.hq", pa.float64())])
    per = -(-n // files)
    total = 0
    for f in range(files):
        lo, hi = f * per, min(n, (f + 1) * per)
        m = hi - lo
        toks = rng.integers(20, 2000, size=m)
        scores = rng.integers(0, 100, size=m).astype(np.float64)
        scores[rng.random(m) < 0.05] = np.nan
        total += int(toks.sum())
        ids = pa.array(np.char.add("web-", np.arange(lo, hi).astype(str)).astype(object))
        table = pa.table({"id": ids, "text": pa.array(["w"] * m), "source": pa.array(["web"] * m),
                          "meta": pa.array([[]] * m, type=schema.field("meta").type),
                          "n_tokens": pa.array(toks), "quality.hq": pa.array(scores, from_pandas=True)}, schema=schema)
        pq.write_table(table, tmp / f"part-{f:05d}.parquet")
    shutil.rmtree(root / "web", ignore_errors=True)
    finalize_component(tmp, root / "web", {"job": "bench.ingest", "name": "web", "n_tokens": total, "tokenizer": "words"})
    return root / "web"


def peak_of(cmd: list[str]) -> tuple[float, float, str]:
    """(wall s, peak RSS MiB, stdout) of one command: a small wrapper process runs it and reports
    its children's ru_maxrss (the kernel's peak resident set), so each figure is that command's."""
    wrapper = ("import json, os, resource, subprocess, sys, time; t=time.perf_counter(); "
               "p=subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(json.dumps({'rc': p.returncode, 'wall_s': time.perf_counter()-t, "
               "'peak_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss/1024, "
               "'out': p.stdout[-4000:], 'err': p.stderr[-4000:]}))")
    res = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
    r = json.loads(res.stdout.strip().splitlines()[-1])
    if r["rc"]:
        raise RuntimeError(f"{cmd[:4]} failed: {r['err']}")
    return r["wall_s"], r["peak_mib"], r["out"]


def bench(n: int, work: Path) -> dict:
    root = work / f"n{n}"
    t0 = time.perf_counter()
    comp = make_component(root / "components", n)
    build_s = time.perf_counter() - t0
    total = Component.open(comp).manifest.n_tokens
    rules = {"slice_tokens": total // 100, "quantile_min_tokens": total // 2, "random_min_tokens": 1}
    cfg = {"components": [{"path": str(comp)}], "rules": rules, "out": str(root / "plan")}
    (root / "plan.yaml").write_text(yaml.safe_dump(cfg))
    shutil.rmtree(root / "plan", ignore_errors=True)
    wall, peak, out = peak_of([sys.executable, "-m", "proxy_eval", "plan", "--config", str(root / "plan.yaml")])
    plan = json.loads((root / "plan" / "manifest.json").read_text())
    mem_wall, mem_peak, mem_out = peak_of([sys.executable, "-c", IN_MEMORY, json.dumps(cfg)])
    mem = json.loads(mem_out.strip().splitlines()[-1])
    streamed = {s["name"]: [s["n_docs"], s["n_tokens"]] for s in plan["slices"]}
    assert streamed == mem["slices"], (streamed, mem["slices"])
    shutil.rmtree(root, ignore_errors=True)
    return {"docs": n, "tokens": total, "build_component_s": round(build_s, 1),
            "plan_cli_wall_s": round(wall, 1), "plan_cli_peak_rss_mib": round(peak),
            "in_memory_wall_s": round(mem_wall, 1), "in_memory_peak_rss_mib": round(mem_peak),
            "same_slices": True, "slice_docs": {k: v[0] for k, v in streamed.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default="1000000,10000000")
    ap.add_argument("--work", default="/tmp/proxy_plan_bench")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cpus", flush=True)
    # what the imports alone cost: the CLI (every command's modules) and the peer's modules
    cli_s, cli_mib, _ = peak_of([sys.executable, "-m", "proxy_eval", "--help"])
    peer_s, peer_mib, _ = peak_of([sys.executable, "-c", "import proxy_eval.plan, proxy_eval.slices"])
    print(json.dumps({"imports": {"cli_help_s": round(cli_s, 1), "cli_help_peak_rss_mib": round(cli_mib),
                                  "peer_imports_s": round(peer_s, 1), "peer_imports_peak_rss_mib": round(peer_mib)}}),
          flush=True)
    for n in [int(x) for x in args.docs.split(",")]:
        print(json.dumps(bench(n, work)), flush=True)


if __name__ == "__main__":
    main()
