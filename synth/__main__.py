"""`python -m synth <generator> --out DIR [--endpoint URL]... [--model NAME] [--backend openai|batch|vllm] [key=value ...]`

Runs a generator (a built-in name such as `reasoning_pairs`, a domain generator such as `text_to_sql`,
`tool_use`, `tool_use_conversational`, `code_concepts`, `finance`, `mcq`, or a YAML path; a YAML's
`imports:` register its sources and steps); `key.sub=value` overrides any config field
(`source.n=20`, `steps.0.n=8`). Other commands:

    python -m synth list                                  generators, steps, sources, verifiers
    python -m synth export RUN_DIR [--formats jsonl,parquet,datasets] [--out DIR]
    python -m synth clean RECORDS.jsonl --out DIR [--eval PATH:FIELD]... [--n 13]
    python -m synth serve vllm|llamacpp [--model PATH] [--port 8000]   (foreground; Ctrl-C stops)
                          [--tool-parser hermes] [--chat-template FILE]   (vLLM: native tool calls)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from purokit.cli import Command, dispatch
from purokit import atomic
from purokit.records import read_records, write_records
from synth import servers
from synth.client import CircuitOpenError, EndpointNotReady, RequestRejected
from synth.decontam import build_eval_index, clean_records, removal_summary
from synth.engine import apply_teacher_overrides, load_generator, run
from synth.export import export_run
from synth.pipeline import POST_STEPS, SOURCES, STEPS
from synth.servers import ServerError
from synth.verify import VERIFIERS



def _generator_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, type=Path, help="output directory (resumes a run found there)")
    ap.add_argument("--endpoint", action="append", default=[], help="teacher base URL (repeat for several)")
    ap.add_argument("--model", help="served model name for every teacher")
    ap.add_argument("--backend", choices=["openai", "batch", "vllm"],
                    help="openai: HTTP endpoints; batch: the OpenAI Batch API on them; vllm: in-process")
    ap.add_argument("--teacher-role", action="append", default=[],
                    help="apply --endpoint/--model/--backend only to these teacher roles")
    ap.add_argument("--fresh", action="store_true", help="restart: forget finished prompts (the cache is kept)")
    ap.add_argument("--no-progress", action="store_true")


def _run_generator(args: argparse.Namespace) -> int:
    cfg = apply_teacher_overrides(args.cfg, args.endpoint, args.model, args.backend, args.teacher_role)
    res = run(cfg, args.out, fresh=args.fresh, progress=not args.no_progress)
    m = res.manifest
    if m.status != "complete":
        print(f"{m.generator}: {m.counts['prompts_done']}/{m.counts['prompts']} prompts done; "
              f"{m.errors['prompts_failed']} failed this run (first: {m.errors['examples'][:1]}). "
              f"Run the same command again to retry them; see {args.out}/manifest.partial.json", file=sys.stderr)
        return 3
    print(f"{m.generator}: {m.counts['records']} records from {m.counts['prompts']} prompts -> {res.records_path}")
    for name, sc in m.steps.items():
        acc = "-" if sc["acceptance"] is None else f"{sc['acceptance']:.1%}"
        print(f"  {name:<28} in {sc['in']:>6}  out {sc['out']:>6}  acceptance {acc}")
    print(f"  tokens: {m.usage['prompt_tokens']} prompt, {m.usage['completion_tokens']} completion; "
          f"{m.usage['cached']}/{m.usage['requests']} requests from cache")
    return 0


def _list(args: argparse.Namespace) -> int:
    here = Path(__file__).resolve().parent
    gens = sorted(str(p.relative_to(here)) for d in ("generators", "domains") for p in (here / d).glob("*.yaml"))
    print("generators:", ", ".join(gens))
    print("steps:     ", ", ".join(sorted(STEPS)))
    print("post steps:", ", ".join(sorted(POST_STEPS)))
    print("sources:   ", ", ".join(sorted(SOURCES)))
    print("verifiers: ", ", ".join(sorted(VERIFIERS)))
    return 0


def _export_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--formats", default="jsonl,parquet,datasets")


def _export(a: argparse.Namespace) -> int:
    m = export_run(a.run_dir, a.out, [f for f in a.formats.split(",") if f])
    print(json.dumps(m["splits"]), "->", a.out or a.run_dir / "export")
    return 0


def _clean_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("records", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--eval", action="append", default=[], help="PATH:FIELD[,FIELD] (jsonl/parquet/datasets dir)")
    ap.add_argument("--n", type=int, default=13)


def _clean(a: argparse.Namespace) -> int:
    specs = []
    for e in a.eval:
        path, _, fields = e.rpartition(":") if ":" in e else (e, "", "question")
        specs.append({"path": path, "fields": fields.split(",")})
    idx = build_eval_index(specs, a.n) if specs else None
    kept, removals = clean_records(list(read_records(a.records)), idx)
    a.out.mkdir(parents=True, exist_ok=True)
    write_records(a.out / "records.jsonl", kept)
    atomic.write_text(a.out / "removals.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in removals))
    print(f"kept {len(kept)}, removed {len(removals)}: {json.dumps(removal_summary(removals))}")
    return 0


def _serve_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("kind", choices=["vllm", "llamacpp"])
    ap.add_argument("--model", help="HF directory (vllm) or GGUF file (llamacpp); default: the SmolLM2 teacher")
    ap.add_argument("--served-name", default="teacher")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--python", help="interpreter of the server's venv (default .venv-vllm / .venv-llamacpp)")
    ap.add_argument("--tool-parser", help="vLLM: serve native tool calls with this --tool-call-parser (e.g. hermes)")
    ap.add_argument("--chat-template", help="vLLM: a Jinja chat template (default with --tool-parser and the SmolLM2 "
                                            "teacher: synth/templates/smollm2_tools.jinja)")


def _serve(a: argparse.Namespace) -> int:
    extra = {k: v for k, v in (("tool_parser", a.tool_parser), ("chat_template", a.chat_template)) if v}
    spec = servers.default_spec(a.kind, model=a.model, served_name=a.served_name, port=a.port, python=a.python, **extra)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM (kill, a supervisor) and SIGINT (also when started in the background, where a shell
    # ignores it) both stop the server, never leave it running without this process
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    srv = servers.start_server(spec)
    print(f"serving {spec.served_name} at {srv.base_url} (pid {srv.pid}, log {srv.log_path}); Ctrl-C stops", flush=True)
    try:
        srv.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


GENERATOR = Command(_run_generator, __doc__, _generator_args, config=load_generator, config_flag="generator")
COMMANDS = {
    "list": Command(_list, "generators, steps, sources, verifiers"),
    "export": Command(_export, "a run's records as jsonl / parquet / datasets splits", _export_args),
    "clean": Command(_clean, "decontaminate records against evaluation sets", _clean_args),
    "serve": Command(_serve, "a local vLLM or llama.cpp teacher in the foreground", _serve_args),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv, default=GENERATOR, prog="python -m synth",
                    errors=(CircuitOpenError, EndpointNotReady, RequestRejected, ServerError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
