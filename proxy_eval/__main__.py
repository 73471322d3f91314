"""`python -m proxy_eval <command>`

  plan      --config plan.yaml [key=value ...]    slice plan (Puro's rules) + each slice as a component
  run       --config proxy.yaml [key=value ...]   proxy continuation runs + suite + profile (resumable)
  eval      --model PATH --suite suite.yaml --out DIR   score one trainer checkpoint or HF model directory
  profile   --results [NAME=]results.json ... --out DIR  profile table from evaluation results
  pca       --profile DIR --out DIR               z-scored PCA of capability vectors + biplot PNG
  suggest   --profile DIR --plan DIR --out mixture.yaml   thresholds + a mixture spec draft
  fit       cost|power|mpl --csv FILE             cost law, loss power law, Multi-Power Law
  track     --run DIR --suite suite.yaml --out DIR   merged-checkpoint evaluation (WSM-style windows)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import importlib

from purokit import atomic
from purokit.cli import Command, dispatch, job_notes
from purokit.config import load_config, load_yaml, validate


def _print(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _config(where: str):
    """The loader of a command's typed config `module:Class` (imported when the command runs, so
    a bad config fails before torch and the model code load)."""
    module, name = where.split(":")
    return lambda path, overrides: load_config(getattr(importlib.import_module(module), name), path, overrides)


def cmd_plan(args) -> int:
    from proxy_eval.plan import make_plan
    from proxy_eval.slices import describe_plan

    plan = make_plan(args.cfg)
    for line in describe_plan(plan.decisions):
        print(line)
    print(json.dumps({"out": args.cfg.out, "slices": [s.name for s in plan.slices]}))
    return 0


def cmd_run(args) -> int:
    from proxy_eval.profiles import read_profile
    from proxy_eval.run import ProxyRunner

    cfg = args.cfg
    manifest = ProxyRunner(cfg, progress=job_notes()).run()
    for line in read_profile(Path(cfg.out) / "profile").table_lines():
        print(line)
    print(json.dumps({"out": cfg.out, "steps": manifest.steps, "profile": manifest.profile}))
    return 0


def cmd_run_slice(args) -> int:
    from proxy_eval.run import ProxyRunConfig, run_one_slice

    cfg = validate(ProxyRunConfig, json.loads(Path(args.config).read_text()), args.config)
    m = run_one_slice(cfg, args.slice, args.steps)
    print(json.dumps({"slice": m.slice, "checkpoint": m.checkpoint}))
    return 0


def cmd_eval(args) -> int:
    from proxy_eval.evaluate import evaluate_suite, load_suite
    from proxy_eval.loading import open_scorer

    suite = args.cfg
    if args.skip_bad_records:
        suite = suite.model_copy(update={"tasks": [t.model_copy(update={"bad_records": "skip"}) for t in suite.tasks]})
    tasks = load_suite(suite)               # bad benchmark records stop here, before a model loads
    scorer = open_scorer(args.model, tokenizer=args.tokenizer, device=args.device, name=args.name,
                         max_length=suite.max_length)
    result = evaluate_suite(scorer, suite, tasks, batch_size=args.batch_size)
    result.write(args.out)
    for r in result.results:
        print(f"{r.task:<24} {r.group:<10} {r.metric:<14} {r.value:.4f} ± {r.stderr:.4f}  (n={r.n})")
    print(json.dumps({"out": args.out, "model": result.model}))
    return 0


def _results_rows(items: list[str]) -> list[dict]:
    from proxy_eval.contracts import SuiteResults

    rows = []
    for item in items:
        name, _, path = item.rpartition("=")
        p = Path(path)
        rows += SuiteResults.read(p / "results.json" if p.is_dir() else p).rows(name or None)
    return rows


def cmd_profile(args) -> int:
    from proxy_eval.profiles import build_profile

    profile = build_profile(_results_rows(args.results))
    paths = profile.write(args.out)
    for line in profile.table_lines():
        print(line)
    print(json.dumps(paths))
    return 0


def _capability_matrix(profile, level: str, exclude: set[str]):
    table = profile.groups if level == "groups" else profile.scores
    table = table.loc[[r for r in table.index if r not in exclude]]
    return table


def cmd_pca(args) -> int:
    from proxy_eval.contracts import PcaFile
    from proxy_eval.pca import biplot, capability_pca
    from proxy_eval.profiles import read_profile

    profile = read_profile(args.profile)
    table = _capability_matrix(profile, args.level, set(filter(None, args.exclude.split(","))))
    anchors = [a for a in args.anchors.split(",") if a] if args.anchors else None
    res = capability_pca(table.to_numpy(dtype=float), list(table.index), list(table.columns), sign_anchors=anchors)
    out = Path(args.out)
    png = biplot(res, out / "biplot.png")
    PcaFile(level=args.level, **res.to_dict()).write(out / "pca.json")
    evr = ", ".join(f"PC{i + 1} {100 * v:.1f}%" for i, v in enumerate(res.explained_variance_ratio))
    print(f"explained variance: {evr}")
    for i, v in enumerate(res.variables):
        print(f"  {v:<16} PC1 {res.loadings[i, 0]:+.3f}" + (f"  PC2 {res.loadings[i, 1]:+.3f}" if res.loadings.shape[1] > 1 else ""))
    print(json.dumps({"pca": str(out / "pca.json"), "biplot": str(png)}))
    return 0


def _parse_weights(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        out[k.strip()] = float(v) if v else 1.0
    return out


def cmd_suggest(args) -> int:
    from proxy_eval.decide import suggest_from_plan
    from proxy_eval.profiles import read_profile

    profile = read_profile(args.profile)
    base = load_yaml(args.base_spec) if args.base_spec else {}
    result = suggest_from_plan(
        profile, args.plan, emphasis=_parse_weights(args.emphasis), temperature=args.temperature,
        budget_tokens=args.budget_tokens, max_epochs=args.max_epochs, tolerance=args.tolerance,
        exclude=set(filter(None, args.exclude.split(","))), base_spec=base, name=args.name)
    atomic.write_text(args.out, result["spec_yaml"])
    report = Path(args.out).with_suffix(".json")
    atomic.write_json(report, {k: v for k, v in result.items() if k != "spec_yaml"})
    for c, w in sorted(result["suggestion"]["weights"].items(), key=lambda kv: -kv[1]):
        print(f"  {c:<20} weight {w:.3f}")
    for c, d in result["thresholds"].items():
        print(f"  {c}: keep the top {100 * d['keep_fraction']:.3g}% ({d['limited_by']}): {d['reason']}")
    print(json.dumps({"spec": args.out, "report": str(report)}))
    return 0


def cmd_fit(args) -> int:
    from proxy_eval import fits

    with open(args.csv, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    out = fits.fit_rows(args.kind, rows, c0=args.c0, invert=args.invert or [], heldout=args.heldout or [],
                        warmup_sum=args.warmup_sum)
    _print(out)
    if args.out:
        atomic.write_json(args.out, out)
    return 0


def cmd_track(args) -> int:
    from proxy_eval.merge import track_run, write_track

    windows = [int(w) for w in args.windows.split(",") if w]
    points = track_run(args.run, args.cfg, windows=windows, shape=args.shape, tokenizer=args.tokenizer, at=args.at,
                       batch_size=args.batch_size)
    for line in write_track(args.out, points, args.shape, windows):
        print(line)
    print(json.dumps({"track": str(Path(args.out) / "track.json")}))
    return 0


def _run_slice_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True)
    p.add_argument("--slice", required=True)
    p.add_argument("--steps", type=int, default=None)


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--skip-bad-records", action="store_true",
                   help="leave out records that do not fit their layout (counted in results.json) instead of "
                        "stopping at the first")


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", nargs="+", required=True, help="[NAME=]path/to/results.json (or its directory)")
    p.add_argument("--out", required=True)


def _pca_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--level", choices=["groups", "tasks"], default="groups")
    p.add_argument("--anchors", default="General,Math", help="variables that load positively on PC1, PC2, ...")
    p.add_argument("--exclude", default="base", help="rows to leave out (comma-separated)")


def _suggest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--emphasis", default=None, help="Group=weight,... (default: all groups equally)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--budget-tokens", type=int, default=None)
    p.add_argument("--max-epochs", type=float, default=1.0)
    p.add_argument("--tolerance", type=float, default=0.5, help="score points a quantile slice may lose and still pay")
    p.add_argument("--exclude", default="base")
    p.add_argument("--base-spec", default=None, help="YAML with tokenizer, seq_len, seeds, ... for the draft")
    p.add_argument("--name", default="proxy-suggestion")


def _fit_args(p: argparse.ArgumentParser) -> None:
    from proxy_eval.fits import PURO_C_P1_KUSD

    p.add_argument("kind", choices=["cost", "power", "mpl"])
    p.add_argument("--csv", required=True, help="cost: cost,score | power: compute,loss | mpl: curve,step,lr,loss")
    p.add_argument("--c0", type=float, default=PURO_C_P1_KUSD, help="cost law: the fixed cost C0 (Puro: $1.84K)")
    p.add_argument("--invert", type=float, nargs="*", help="cost law: scores to invert into costs")
    p.add_argument("--heldout", nargs="*", help="mpl: curves left out of the fit and predicted")
    p.add_argument("--warmup-sum", type=float, default=0.0, help="mpl: S_W, the warmup learning-rate sum")
    p.add_argument("--out", default=None)


def _track_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="a trainer run directory (or its checkpoints/)")
    p.add_argument("--out", required=True)
    p.add_argument("--windows", default="5,10,20", help="updates per merge window (checkpoints - 1)")
    p.add_argument("--shape", default="1-sqrt", choices=["1-sqrt", "linear", "cosine", "constant", "equal"])
    p.add_argument("--at", default="latest", choices=["latest", "all"])
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--batch-size", type=int, default=None)


COMMANDS = {
    "plan": Command(cmd_plan, "slice plan by Puro's rules; writes each slice as a component",
                    config=_config("proxy_eval.plan:PlanConfig")),
    "run": Command(cmd_run, "proxy runs over the planned slices, then the profile",
                   config=_config("proxy_eval.run:ProxyRunConfig")),
    "run-slice": Command(cmd_run_slice, "(internal) one slice, in a worker process", _run_slice_args),
    "eval": Command(cmd_eval, "score a trainer checkpoint or a Hugging Face model directory", _eval_args,
                    config=_config("proxy_eval.tasks:SuiteConfig"), config_flag="--suite"),
    "profile": Command(cmd_profile, "profile table from results.json files", _profile_args),
    "pca": Command(cmd_pca, "PCA of capability vectors and a biplot", _pca_args),
    "suggest": Command(cmd_suggest, "thresholds from quantile slices and a mixture spec draft", _suggest_args),
    "fit": Command(cmd_fit, "scaling-law fits from a CSV", _fit_args),
    "track": Command(cmd_track, "evaluate merges of recent checkpoints (WSM-style) along a trainer run", _track_args,
                     config=_config("proxy_eval.tasks:SuiteConfig"), config_flag="--suite"),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv, prog="python -m proxy_eval")


if __name__ == "__main__":
    sys.exit(main())
