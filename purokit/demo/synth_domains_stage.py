"""Demo stage "synth_domains": the text-to-SQL and general tool-use generators (Nemotron 3 Super
§3.1.1) against the synth stage's teacher, with acceptance printed for every stage.

The teacher is the one the "synth" stage started (SmolLM2-135M-Instruct behind vLLM's OpenAI
server, or the scripted server in the `ci` profile), still running: it is started once for both
stages. When the synth stage was reused from an earlier run, the teacher is started again from
the launch spec that stage recorded. This stage is its last user and stops it when done (also on
an error or Ctrl-C). Both generators run at once against it, so the server batches their
requests. SmolLM2's chat template has no tools, so the tool-use generator's `tool_protocol: auto`
finds the endpoint without native tool calling and prompts the Hermes layout. So small a model
gets almost nothing through: its schemas, queries and tool calls fail the validators, which is
what this stage shows (every rejection is in each run's rejects.jsonl with its stage and reason).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from purokit.demo.synth_stage import release_teacher, shared_teacher

# Smaller token budgets than the shipped configs: a 135M model rambles, and the stage has ~1.5 min.
SQL_PARAMS = {"schema": {"max_tokens": 360, "temperature": 0.7}, "task": {"max_tokens": 160, "temperature": 0.7}}
TOOL_PARAMS = {"query": {"params": {"max_tokens": 60, "temperature": 0.8}},
               "simulate": {"assistant_params": {"max_tokens": 120, "temperature": 0.6},
                            "tool_params": {"max_tokens": 80, "temperature": 0.3},
                            "user_params": {"max_tokens": 60, "temperature": 0.8}, "max_steps_per_turn": 2}}
JUDGE_PARAMS = {"temperature": 0.0, "max_tokens": 40}


def _configure(name: str, base_url: str, engine: str, source: dict[str, Any], step_params: dict[str, dict[str, Any]]) -> Any:
    from synth.engine import load_generator
    from synth.pipeline import GeneratorConfig

    data = load_generator(name).model_dump(mode="json")
    data["source"] = dict(data["source"], **source)
    for step in data["steps"]:
        step.update(step_params.get(step.get("name"), {}))
        if "judge" in step:
            step["judge"] = dict(step["judge"], params=JUDGE_PARAMS)
        if step.get("kind") == "sql_schema":
            step["params"] = SQL_PARAMS["schema"]
        if step.get("kind") == "sql_task":
            step["params"] = SQL_PARAMS["task"]
    for t in data["teachers"].values():
        # start low: the limit grows while answers stay fast and falls when the shared CPU teacher
        # slows down (synth.client.LatencyGradient), instead of 16 slow answers past timeout_s
        t.update(endpoints=[base_url], model="teacher", engine=engine, initial_concurrency=4, max_concurrency=32,
                 ready_timeout_s=60, timeout_s=120)
    return GeneratorConfig.model_validate(data)


def _tool_protocol(run_dir: Any) -> Any:
    """How the tool-use run's assistant called tools (its `tool_protocol: auto` probe, cached with the answers)."""
    from synth.backends import cached_tool_support
    from synth.cache import ResponseCache
    if not (run_dir / "cache.sqlite").is_file():
        return None
    cache = ResponseCache(run_dir / "cache.sqlite")
    try:
        return cached_tool_support(cache, "teacher")
    finally:
        cache.close()


def _acceptance(m: Any) -> dict[str, dict[str, Any]]:
    return {name: {"in": sc["in"], "out": sc["out"], "acceptance": sc["acceptance"]} for name, sc in m.steps.items()}


def run(ctx: Any) -> dict[str, Any]:
    for domain in ("text_to_sql", "tool_use"):          # importing them registers their sources and steps
        importlib.import_module(f"synth.domains.{domain}")
    from synth.engine import run_async

    out = ctx.stage_dir()
    n_sql = int(ctx.size("synth_domains_sql_n", 8))
    n_tool = int(ctx.size("synth_domains_tool_n", 8))
    try:
        base_url, engine = shared_teacher(ctx, out / "logs")
        sql_cfg = _configure("text_to_sql", base_url, engine, {"n": n_sql, "dialects": ["sqlite", "postgres", "mysql"]}, {})
        tool_cfg = _configure("tool_use", base_url, engine, {"n": n_tool}, TOOL_PARAMS)
        ctx.step(f"generating at once: {n_sql} text-to-SQL buckets and {n_tool} tool-use tasks against {base_url}")

        async def both() -> tuple[Any, Any]:
            return await asyncio.gather(
                run_async(sql_cfg, out / "text_to_sql", progress=lambda line: ctx.step(f"text_to_sql: {line}"),
                          restart_if_changed=True),
                run_async(tool_cfg, out / "tool_use", progress=lambda line: ctx.step(f"tool_use: {line}"),
                          restart_if_changed=True))

        sql_res, tool_res = asyncio.run(both())
    finally:
        release_teacher(ctx)              # the last stage that needs it
    result: dict[str, Any] = {"teacher": {"base_url": base_url, "engine": engine}}
    for name, res in (("text_to_sql", sql_res), ("tool_use", tool_res)):
        m = res.manifest
        acc = _acceptance(m)
        ctx.step(f"{name}: {m.counts['records']} records from {m.counts['prompts']} prompts; acceptance per stage:")
        for stage, sc in acc.items():
            rate = "-" if sc["acceptance"] is None else f"{sc['acceptance']:.0%}"
            ctx.step(f"  {stage:<26} {sc['out']:>4} / {sc['in']:<4} ({rate})")
        export_dir = res.out_dir / "export"
        train = export_dir / "train.jsonl"
        result[name] = {"records": str(res.records_path), "rejects": str(res.out_dir / "rejects.jsonl"),
                        "export_dir": str(export_dir), "train_jsonl": str(train) if train.exists() else None,
                        "manifest": str(res.out_dir / "manifest.json"), "n_records": m.counts["records"],
                        "n_prompts": m.counts["prompts"], "acceptance": acc,
                        "step_order": list(acc),           # pipeline order (stage.json sorts keys)
                        "completion_tokens": m.usage["completion_tokens"]}
    verdict = _tool_protocol(out / "tool_use")
    if verdict is not None:
        result["tool_use"]["tool_protocol"] = {"protocol": "native" if verdict.native else "prompted", "why": verdict.reason}
        ctx.step(f"tool_use called tools {result['tool_use']['tool_protocol']['protocol']}: {verdict.reason}")
    return result


def summary(result: dict[str, Any]) -> list[str]:
    lines = []
    for name in ("text_to_sql", "tool_use"):
        r = result[name]
        first_drop = next((s for s in r.get("step_order") or r["acceptance"]
                           if (sc := r["acceptance"][s])["in"] and sc["out"] < sc["in"]), None)
        lines.append(f"{name}: {r['n_records']} records from {r['n_prompts']} prompts -> {r['records']}"
                     + (f" (first losses at stage '{first_drop}'; reasons in {r['rejects']})" if first_drop else ""))
    lines.append(f"teacher: {result['teacher']['engine']} at {result['teacher']['base_url']} (the synth stage's, "
                 "stopped after this stage)")
    return lines
