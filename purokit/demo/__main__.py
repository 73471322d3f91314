"""`python -m purokit.demo [--out runs/demo] [--profile demo|ci] [--only a,b] [--force a,b]`"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from purokit import atomic
from purokit.hashing import config_hash
from purokit.demo.context import PROFILES, DemoContext
from purokit.demo.stages import STAGES

STAGE_FILE = "stage.json"


def run_demo(root: Path, profile: str = "demo", only: set[str] | None = None, force: set[str] | None = None) -> DemoContext:
    ctx = DemoContext(root=root, profile=profile)
    root.mkdir(parents=True, exist_ok=True)
    try:
        _run_stages(ctx, profile, only, force or set())
    finally:
        # a stage module may hold resources across stages (the synth teacher); its `cleanup(ctx)`
        # releases them when the run ends, also after an error or Ctrl-C
        for _, module_name in reversed(STAGES):
            cleanup = getattr(sys.modules.get(module_name), "cleanup", None)
            if cleanup is not None:
                cleanup(ctx)
    return ctx


def _run_stages(ctx: DemoContext, profile: str, only: set[str] | None, force: set[str]) -> None:
    root = ctx.root
    for name, module_name in STAGES:
        ctx.stage = name
        done = root / name / STAGE_FILE
        # A stage is reused only if it finished with the same profile and the same upstream results;
        # rerunning an earlier stage that changes its result reruns everything after it.
        upstream = config_hash({"profile": profile, "results": ctx.results})
        if done.is_file() and name not in force:
            recorded = json.loads(done.read_text())
            if recorded.get("upstream") == upstream:
                ctx.results[name] = recorded["result"]
                ctx.step(f"reused (finished before; --force {name} reruns it)")
                continue
        if only and name not in only:
            continue
        module = importlib.import_module(module_name)
        t0 = time.perf_counter()
        result = module.run(ctx)
        elapsed = time.perf_counter() - t0
        ctx.results[name] = result
        atomic.write_json(done, {"profile": profile, "upstream": upstream, "elapsed_s": round(elapsed, 1), "result": result})
        ctx.step(f"done in {elapsed:.1f}s")


def print_summary(ctx: DemoContext) -> None:
    print("\nWhere everything is:")
    for name, module_name in STAGES:
        if name not in ctx.results:
            continue
        module = importlib.import_module(module_name)
        lines = module.summary(ctx.results[name]) if hasattr(module, "summary") else [
            f"{k}: {v}" for k, v in ctx.results[name].items() if isinstance(v, (str, int, float))
        ]
        print(f"  {name}")
        for line in lines:
            print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    """The demo under the one error policy: bad input (a stage's contract error, a missing file) is one
    line and exit 2, a bug keeps its traceback."""
    from purokit.cli import guard

    return guard("python -m purokit.demo", _main, argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m purokit.demo", description=__doc__)
    ap.add_argument("--out", default="runs/demo", type=Path)
    ap.add_argument("--profile", default="demo", choices=sorted(PROFILES))
    ap.add_argument("--only", default="", help="comma-separated stages to run (others are reused if finished)")
    ap.add_argument("--force", default="", help="comma-separated stages to rerun even if finished")
    args = ap.parse_args(argv)
    split = lambda s: {x for x in s.split(",") if x}  # noqa: E731
    ctx = run_demo(args.out.resolve(), args.profile, split(args.only) or None, split(args.force))
    print_summary(ctx)
    if ctx.results:
        from purokit.demo.report import build_report
        print(f"\nReport: {build_report(ctx.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
