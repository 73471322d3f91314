"""What decides what enters a dataset holds on real teacher outputs (issue 14, engine half):
verifiers off the event loop under a time limit, structured replies checked against their
schema, thinking from `reasoning_content`, RL records that hold the prompt as sampled and the
engine as the endpoint reports it, one limiter per endpoint, Retry-After waited out, and
persistent per-prompt failures ending as a partial run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import yaml

from purokit.records import read_records
from synth.checkpool import CheckTimeout, check_pool
from synth.client import ChatClient, ChatRequest, ScaledClock, TeacherConfig
from synth.engine import run
from synth.fakeserver import Fault
from synth.pipeline import GeneratorConfig
from synth.verify import Outcome, register_verifier, verify_math

from .conftest import fast_teacher


@register_verifier("test_hangs_on_towers")
def hangs_on_towers(response: str, reference, row) -> Outcome:
    """A verifier that never returns on some inputs (as a grader simplifying `9^{9^{9}}` can)."""
    while "9^{9^{9}}" in response:
        pass
    return verify_math(response, reference, row)


def gen(d: dict) -> GeneratorConfig:
    return GeneratorConfig.model_validate(d)


def items(*pairs):
    return {"kind": "inline", "items": [{"id": f"p{i}", "prompt": q, "reference": a} for i, (q, a) in enumerate(pairs)]}


def test_a_verifier_that_never_returns_is_a_timeout_rejection(fake_server, tmp_path):
    """A verifier that never returns on `\\boxed{9^{9^{9}}}`: the run still finishes, that sample
    is rejected with verdict timeout, and the other prompt's sample is verified as usual."""
    def responder(req):
        q = req["messages"][-1]["content"]
        return "The answer is \\boxed{9^{9^{9}}}." if "tower" in q else "The answer is \\boxed{4}."

    srv = fake_server(responder)
    cfg = {"generator": "t", "teachers": {"t": fast_teacher([srv.base_url])},
           "source": items(("A tower of nines?", "1"), ("What is 2 + 2?", "4")),
           "steps": [{"kind": "generate", "field": "a", "teacher": "t", "n": 1},
                     {"kind": "verify", "fields": ["a"], "method": "test_hangs_on_towers"},
                     {"kind": "format_sft", "field": "a"}],
           "output": {"formats": ["jsonl"], "check_timeout_s": 1.5}}
    t0 = time.perf_counter()
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert time.perf_counter() - t0 < 60
    assert res.manifest.steps["verify"] == {"kind": "verify", "in": 2, "out": 1, "acceptance": 0.5}
    rejects = [json.loads(x) for x in (tmp_path / "r" / "rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["verifier timeout: hangs_on_towers ran past 1.5 s"]
    assert [r.prompt_id for r in read_records(res.records_path)] == ["p1"]


def test_the_check_pool_replaces_a_killed_worker():
    async def go():
        pool = check_pool()
        try:
            await pool.run(hangs_on_towers, "\\boxed{9^{9^{9}}}", "1", {}, timeout_s=0.5)
        except CheckTimeout as e:
            assert "0.5 s" in str(e)
        else:
            raise AssertionError("no timeout")
        return await asyncio.gather(*(pool.run(verify_math, f"\\boxed{{{i}}}", str(i), {}, timeout_s=20) for i in range(50)))

    assert all(o.passed for o in asyncio.run(go()))


def test_json_schema_replies_are_checked_rejected_or_asked_again(fake_server, tmp_path):
    def responder(req):
        if "not valid" in req["messages"][-1]["content"]:
            return '{"answer": 7}'
        return "Sure! The answer is 7."

    srv = fake_server(responder)
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    step = {"kind": "generate", "field": "a", "teacher": "t", "n": 2, "json_schema": schema}
    cfg = {"generator": "t", "teachers": {"t": fast_teacher([srv.base_url])}, "source": items(("3 + 4?", "7")),
           "steps": [step, {"kind": "format_sft", "field": "a"}], "output": {"formats": ["jsonl"]}}
    res = run(gen(cfg), tmp_path / "reject", progress=False)
    assert res.n_records == 0 and res.manifest.steps["generate:a"]["out"] == 0
    rejects = [json.loads(x) for x in (tmp_path / "reject" / "rejects.jsonl").read_text().splitlines()]
    assert all(r["reason"].startswith("json_schema: reply is not JSON") for r in rejects) and len(rejects) == 2
    sent = [b["response_format"]["json_schema"]["schema"] for b in srv.stats.bodies]
    assert sent == [schema, schema]
    retry = dict(cfg, steps=[dict(step, json_retries=1), {"kind": "format_sft", "field": "a"}])
    res = run(gen(retry), tmp_path / "retry", progress=False)
    assert [json.loads(r.messages[-1].content) for r in read_records(res.records_path)] == [{"answer": 7}] * 2


def test_reasoning_content_becomes_the_think_block_streamed_or_not(fake_server, tmp_path):
    """vLLM/SGLang with a reasoning parser (and DeepSeek's API) return the thinking in
    `reasoning_content` and only the answer in `content`: on-mode records still pass the toggle
    format, and the teacher says where the thinking came from."""
    srv = fake_server(lambda req: {"content": "The answer is \\boxed{4}.", "reasoning_content": "2 + 2 = 4, checked twice."})
    for stream in (False, True):
        cfg = {"generator": "t", "teachers": {"t": fast_teacher([srv.base_url], stream=stream)},
               "source": items(("What is 2 + 2?", "4")),
               "steps": [{"kind": "generate", "field": "a", "teacher": "t", "mode": "on", "n": 2},
                         {"kind": "parse_reasoning", "field": "a"},
                         {"kind": "verify", "fields": ["a"], "method": "math"},
                         {"kind": "format_sft", "field": "a"}], "output": {"formats": ["jsonl"]}}
        res = run(gen(cfg), tmp_path / f"s{stream}", progress=False)
        recs = list(read_records(res.records_path))
        assert len(recs) == 2, stream
        for r in recs:
            assert r.messages[-1].content == "<think>\n2 + 2 = 4, checked twice.\n</think>\nThe answer is \\boxed{4}."
            assert r.teacher.reasoning_field == "reasoning_content" and r.reasoning == "on"


def _rl_config(url: str) -> dict:
    return {"generator": "rl", "seed": 5, "teachers": {"policy": fast_teacher([url], precision="bf16")},
            "source": items(("What is 2 + 2?", "4")),
            "steps": [{"kind": "generate", "field": "s", "teacher": "policy", "n": 4, "mode": "on",
                       "system": "detailed thinking on. Put the answer in \\boxed{{}}.",
                       "fewshot": [{"user": "1 + 1?", "assistant": "<think>\n1+1=2\n</think>\n\\boxed{2}"}],
                       "template": "Solve: {prompt}", "logprobs": True, "return_token_ids": True,
                       "params": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 32}},
                      {"kind": "verify", "fields": ["s"], "method": "math"},
                      {"kind": "pass_rate", "field": "s", "max_pass_rate": 1.01},
                      {"kind": "format_rl", "field": "s"}],
            "output": {"formats": ["jsonl"]}}


def test_rl_records_hold_the_prompt_as_sampled_and_the_engine_as_served(fake_server, tmp_path):
    def responder(req):
        return ("<think>\nadd\n</think>\n\\boxed{4}" if req["seed"] % 2 else "\\boxed{4}")

    served = fake_server(responder, served_info={"owned_by": "vllm", "version": "0.11.0", "dtype": "torch.bfloat16",
                                                 "logprobs_mode": "LogprobsMode.PROCESSED_LOGPROBS"})
    res = run(gen(_rl_config(served.base_url)), tmp_path / "served", progress=False)
    recs = list(read_records(res.records_path))
    (prompt,) = [r for r in recs if r.kind == "rl_prompt"]
    sent = [{"role": "system", "content": "detailed thinking on. Put the answer in \\boxed{}."},
            {"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "<think>\n1+1=2\n</think>\n\\boxed{2}"},
            {"role": "user", "content": "Solve: What is 2 + 2?"}]
    assert [m.model_dump(exclude_none=True) for m in prompt.messages] == sent == served.stats.bodies[0]["messages"]
    rollouts = [r for r in recs if r.kind == "rl_rollout"]
    assert len(rollouts) == 4
    for r in rollouts:
        assert [m.model_dump(exclude_none=True) for m in r.messages[:-1]] == sent
        ro = r.rollout
        assert ro.prompt_token_ids and ro.completion_token_ids and len(ro.rollout_logprobs) == len(ro.completion_token_ids)
        assert (ro.engine, ro.engine_version, ro.precision, ro.logprobs_mode) == ("vllm", "0.11.0", "bfloat16", "processed_logprobs")
        assert ro.engine_source == ro.precision_source == ro.logprobs_mode_source == "endpoint"
        assert ro.logprobs_after_sampling_transforms
        # LN §5.1 format reward: 1 for the think layout its mode asks for
        assert ro.format_reward == (1.0 if "<think>" in r.messages[-1].content else 0.0)
    assert {r.rollout.format_reward for r in rollouts} == {0.0, 1.0}
    # a server that says nothing about itself: the teacher config's values, marked declared
    plain = fake_server(responder)
    res = run(gen(_rl_config(plain.base_url)), tmp_path / "declared", progress=False)
    for r in (r for r in read_records(res.records_path) if r.kind == "rl_rollout"):
        assert (r.rollout.engine, r.rollout.precision) == ("fake", "bf16")
        assert r.rollout.engine_source == r.rollout.precision_source == "declared"


def test_roles_on_one_server_share_its_limit(fake_server, tmp_path):
    """Four roles on one endpoint, each allowed 4 in flight: the server sees at most 4, not 16."""
    srv = fake_server("arithmetic", latency_s=0.02)
    teacher = fast_teacher([srv.base_url], initial_concurrency=4, max_concurrency=4)
    roles = ["a", "b", "c", "d"]
    cfg = {"generator": "t", "teachers": {r: teacher for r in roles},
           "source": {"kind": "arithmetic_word_problems", "n": 16},
           "steps": [{"kind": "generate", "field": r, "teacher": r, "n": 2, "mode": "off"} for r in roles],
           "output": {"formats": ["jsonl"]}}
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "complete" and srv.stats.n_requests == 16 * 2 * 4
    assert 1 < srv.stats.max_inflight <= 4


def test_a_75_s_retry_after_window_is_waited_out(fake_server):
    """A provider that throttles for 75 s with `Retry-After: 75` (the client's clock runs 100x
    faster here): every request completes after the window, none is counted as a failure."""
    srv = fake_server("echo", faults=[Fault("429", window_s=0.75, retry_after_s=75)])
    cfg = TeacherConfig(**fast_teacher([srv.base_url], max_retries=1, breaker_failures=2, breaker_max_trips=1))
    clock = ScaledClock(0.01)

    async def go():
        async with ChatClient(cfg) as client:
            client.pool.clock = client.clock = clock
            t0 = clock.now()
            out = await asyncio.gather(*(client.complete(ChatRequest(messages=[{"role": "user", "content": f"q{i}"}]))
                                         for i in range(8)))
            return out, clock.now() - t0, client.stats()

    out, waited, stats = asyncio.run(go())
    assert len(out) == 8 and all(r.content.startswith("ok ") for r in out)
    assert waited >= 75
    ep = stats["endpoints"][srv.base_url]
    assert ep["retry_after_waits"] >= 1 and ep["breaker_trips"] == 0 and stats["n_retries"] == 0


def test_prompts_that_always_fail_end_as_a_partial_run_with_exit_3(fake_server, tmp_path):
    srv = fake_server("arithmetic", faults=[Fault("500", contains="poison")])
    prompts = [(f"Ada has {i} coins and finds 2 more. How many coins?", str(i + 2)) for i in range(8)]
    prompts[2] = ("poison: Ada has 2 coins?", "2")
    prompts[5] = ("poison: Bo has 5 coins?", "5")
    cfg = {"generator": "t", "teachers": {"t": fast_teacher([srv.base_url], max_retries=1, breaker_failures=3,
                                                            breaker_cooldown_s=0.05, breaker_max_trips=2)},
           "source": items(*prompts), "output": {"formats": ["jsonl"], "max_inflight_rows": 2},
           "steps": [{"kind": "generate", "field": "a", "teacher": "t", "n": 2, "mode": "off"},
                     {"kind": "format_sft", "field": "a"}]}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "synth", str(path), "--out", str(tmp_path / "r"), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    partial = json.loads((tmp_path / "r" / "manifest.partial.json").read_text())
    assert partial["status"] == "partial" and partial["errors"]["prompts_failed"] >= 2
    assert any("p2" in e or "p5" in e for e in partial["errors"]["examples"])
    assert partial["counts"]["prompts_done"] >= 1
