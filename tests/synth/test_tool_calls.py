"""Native OpenAI tool calling in the engine: request fields on the wire, parsed `tool_calls` in
results (plain and streamed), malformed answers, round-tripping assistant calls and tool results,
the cache key, the in-process vLLM adapter, and the tool-support probe, over real HTTP against
the scripted server (which checks the tool protocol as OpenAI/vLLM do)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from synth.backends import CachedBackend, HttpBackend, VllmBackend, tool_support
from synth.cache import ResponseCache, cache_key
from synth.client import (ChatClient, ChatRequest, MalformedResponse, RequestRejected, RetriesExhausted, TeacherConfig,
                          parse_chat_response, request_body)
from synth.fakeserver import request_problem
from synth.toolcalls import canonical_arguments, hermes_blocks, hermes_server_parse, normalize_tool_calls

from .conftest import fast_teacher

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
ASK = [{"role": "user", "content": "Weather and time in Oslo?"}]


def run(coro):
    return asyncio.run(coro)


async def one(cfg: TeacherConfig, *reqs: ChatRequest):
    async with ChatClient(cfg) as c:
        return [await c.complete(r) for r in reqs]


def tool_reply(req):
    """A teacher that calls tools in the Hermes layout until results come back, then answers."""
    msgs = req["messages"]
    if msgs[-1]["role"] == "tool":
        return "Oslo: 3 C, 14:05."
    if "explicit" in msgs[-1]["content"]:
        return {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": "{\"city\": \"Oslo\"}"}]}
    if "no-name" in msgs[-1]["content"]:
        return {"tool_calls": [{"id": "x", "type": "function", "function": {"arguments": "{}"}}]}
    if "bad-args" in msgs[-1]["content"]:
        return {"tool_calls": [{"name": "get_weather", "arguments": "{city: Oslo"}]}
    if "broken" in msgs[-1]["content"]:
        return 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n{"name": oops}\n</tool_call>'
    return ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>')


# ---- pure pieces ---------------------------------------------------------------------------------

def test_request_body_and_cache_key_carry_tools_only_when_set():
    plain = ChatRequest(messages=ASK, params={"max_tokens": 8}, seed=1)
    tooled = ChatRequest(messages=ASK, params={"max_tokens": 8}, seed=1, tools=[WEATHER], tool_choice="auto")
    assert "tools" not in request_body("m", plain) and "tool_choice" not in request_body("m", plain)
    b = request_body("m", tooled)
    assert b["tools"] == [WEATHER] and b["tool_choice"] == "auto"
    # a request without tools keeps the key it had before tools existed (old caches stay valid)
    old_payload = {"model": "m", "messages": ASK, "params": {"max_tokens": 8}, "seed": 1, "logprobs": False,
                   "top_logprobs": 0, "json_schema": None, "return_token_ids": False}
    assert cache_key(plain.cache_payload("m")) == cache_key(old_payload)
    keys = {cache_key(r.cache_payload("m")) for r in (plain, tooled,
                                                      ChatRequest(messages=ASK, params={"max_tokens": 8}, seed=1, tools=[WEATHER, TIME]),
                                                      ChatRequest(messages=ASK, params={"max_tokens": 8}, seed=1, tools=[WEATHER],
                                                                  tool_choice="required"))}
    assert len(keys) == 4


def test_response_tool_calls_are_normalized_and_bad_shapes_rejected():
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}]}
    res = parse_chat_response("u", {"choices": [{"message": msg, "finish_reason": "tool_calls"}]})
    assert res.content == "" and res.finish_reason == "tool_calls"
    assert res.tool_calls == [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]
    assert parse_chat_response("u", {"choices": [{"message": {"content": "hi", "tool_calls": []}}]}).tool_calls is None
    for bad in ({"tool_calls": {"name": "x"}}, {"tool_calls": [{"function": {"arguments": "{}"}}]},
                {"tool_calls": [{"type": "code", "function": {"name": "x"}}]}, {"tool_calls": ["x"]}):
        with pytest.raises(MalformedResponse, match="tool_calls"):
            parse_chat_response("u", {"choices": [{"message": dict(bad, content=None)}]})
    assert normalize_tool_calls(None) is None


def test_hermes_parsing_server_semantics_and_lenient_blocks():
    text = 'Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>{"name": "b"}</tool_call>'
    content, calls = hermes_server_parse(text)
    assert content == "Let me look.\n" and calls == [{"name": "a", "arguments": '{"x": 1}'}, {"name": "b", "arguments": "{}"}]
    # one malformed block: vLLM's parser gives up on the whole reply
    broken = text + '<tool_call>{"name": oops}</tool_call>'
    assert hermes_server_parse(broken) == (broken, [])
    assert hermes_server_parse("plain") == ("plain", [])
    found = hermes_blocks(broken)
    assert [c["name"] for c in found.calls] == ["a", "b"] and len(found.problems) == 1 and found.content == "Let me look."
    assert canonical_arguments('{"b": 1, "a": 2}') == '{"a": 2, "b": 1}' and canonical_arguments("{x") == "{x"
    assert canonical_arguments({"b": [1], "a": "é"}) == '{"a": "é", "b": [1]}'


def test_server_checks_the_tool_protocol_as_openai_does():
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ok = {"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": "c1", "content": "{}"}], "tools": [WEATHER]}
    assert request_problem(ok) is None
    assert "preceding message with 'tool_calls'" in request_problem(dict(ok, messages=ASK + [{"role": "tool", "tool_call_id": "c9", "content": "{}"}]))
    assert "`tools` must be set" in request_problem({"messages": ASK, "tool_choice": "auto"})
    assert "names no tool" in request_problem({"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}})
    assert "function.arguments (text)" in request_problem(dict(ok, messages=ASK + [{"role": "assistant", "content": None, "tool_calls": [
        dict(call, function={"name": "get_weather", "arguments": {"city": 1}})]}]))
    assert "tools[0]" in request_problem({"messages": ASK, "tools": [{"type": "function"}]})
    assert "--enable-auto-tool-choice" in request_problem({"messages": ASK, "tools": [WEATHER]}, tool_calling=False)
    assert request_problem({"messages": ASK, "tools": [WEATHER], "tool_choice": "none"}, tool_calling=False) is None


# ---- over HTTP -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip_over_http(fake_server, stream):
    srv = fake_server(tool_reply, model="fake-teacher")
    cfg = TeacherConfig(**fast_teacher([srv.base_url], stream=stream))
    first = ChatRequest(messages=ASK, params={"max_tokens": 64}, seed=3, tools=[WEATHER, TIME], tool_choice="auto")
    (res,) = run(one(cfg, first))
    assert res.finish_reason == "tool_calls" and res.content.strip() == "Let me look."
    assert [c["function"]["name"] for c in res.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in res.tool_calls] == [{"city": "Oslo"}] * 2
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in res.tool_calls)
    # the assistant's calls and one tool message per call go back; the server accepts them only if they pair up
    follow = ChatRequest(messages=ASK + [{"role": "assistant", "content": res.content, "tool_calls": res.tool_calls}]
                         + [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"ok": i})} for i, c in enumerate(res.tool_calls)],
                         params={"max_tokens": 64}, seed=4, tools=[WEATHER, TIME])
    (done,) = run(one(cfg, follow))
    assert done.content == "Oslo: 3 C, 14:05." and done.tool_calls is None and done.finish_reason == "stop"
    sent = srv.stats.bodies[-1]
    assert sent["messages"][1]["tool_calls"] == res.tool_calls and sent["messages"][2]["tool_call_id"] == res.tool_calls[0]["id"]
    # explicit tool_calls from the server, arguments given decoded or as text
    (exp,) = run(one(cfg, ChatRequest(messages=[{"role": "user", "content": "explicit please"}], seed=5, tools=[WEATHER, TIME])))
    assert [c["function"]["arguments"] for c in exp.tool_calls] == ['{"city": "Oslo"}', '{"city": "Oslo"}']
    # a named tool_choice: vLLM reports finish_reason "stop" with the call
    named = ChatRequest(messages=ASK, seed=6, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (n,) = run(one(cfg, named))
    assert n.tool_calls and n.finish_reason == "stop"


def test_malformed_tool_answers(fake_server):
    srv = fake_server(tool_reply, model="fake-teacher")
    cfg = TeacherConfig(**fast_teacher([srv.base_url], max_retries=1))
    # arguments that are not JSON are the model's doing: passed through verbatim for the validators
    (bad,) = run(one(cfg, ChatRequest(messages=[{"role": "user", "content": "bad-args"}], seed=1, tools=[WEATHER])))
    assert bad.tool_calls[0]["function"]["arguments"] == "{city: Oslo"
    # a malformed call block: the server's parser leaves the whole reply as content, as vLLM's does
    (broken,) = run(one(cfg, ChatRequest(messages=[{"role": "user", "content": "broken"}], seed=1, tools=[WEATHER])))
    assert broken.tool_calls is None and broken.finish_reason == "stop" and broken.content.count("<tool_call>") == 2
    # a call without a function name breaks the protocol: a malformed response, retried, then a clear error
    with pytest.raises(RetriesExhausted, match="no function name"):
        run(one(cfg, ChatRequest(messages=[{"role": "user", "content": "no-name"}], seed=1, tools=[WEATHER])))
    # a tool message answering no call is the request's fault: rejected at once with the server's reason
    with pytest.raises(RequestRejected, match="preceding message with 'tool_calls'"):
        run(one(cfg, ChatRequest(messages=ASK + [{"role": "tool", "tool_call_id": "nope", "content": "{}"}], seed=1)))


def test_a_server_without_tool_calling_rejects_tools_with_its_reason(fake_server):
    srv = fake_server(tool_reply, model="fake-teacher", tool_calling=False)
    cfg = TeacherConfig(**fast_teacher([srv.base_url]))
    with pytest.raises(RequestRejected, match="--enable-auto-tool-choice"):
        run(one(cfg, ChatRequest(messages=ASK, seed=1, tools=[WEATHER])))
    (plain,) = run(one(cfg, ChatRequest(messages=ASK, seed=1)))
    assert "<tool_call>" in plain.content and plain.tool_calls is None        # text, as the model wrote it


def test_cache_keeps_tool_calls_and_tells_tool_requests_apart(fake_server, tmp_path):
    srv = fake_server(tool_reply, model="fake-teacher")
    cfg = TeacherConfig(**fast_teacher([srv.base_url]))
    plain = ChatRequest(messages=ASK, seed=1)
    tooled = ChatRequest(messages=ASK, seed=1, tools=[WEATHER, TIME])

    async def go(backend):
        out = [await backend.complete(plain), await backend.complete(tooled)]
        await backend.close()
        return out
    first_cache = ResponseCache(tmp_path / "c.sqlite")
    a, b = run(go(CachedBackend(HttpBackend(cfg), first_cache)))
    first_cache.close()
    assert a.tool_calls is None and "<tool_call>" in a.content and b.tool_calls and srv.stats.n_requests == 2
    cache = ResponseCache(tmp_path / "c.sqlite")
    a2, b2 = run(go(CachedBackend(HttpBackend(TeacherConfig(**fast_teacher(["http://127.0.0.1:9/v1"]))), cache)))
    assert a2.cached and b2.cached and srv.stats.n_requests == 2
    assert b2.tool_calls == b.tool_calls and b2.finish_reason == "tool_calls" and a2.tool_calls is None


def test_tool_support_probe(fake_server, tmp_path):
    from synth.fakeserver import FakeOpenAIServer

    def plain_model(req):                       # tools accepted, but the "template" drops them
        return "ok"

    class NoRender(FakeOpenAIServer):
        def _completion(self, req):
            return super()._completion({k: v for k, v in req.items() if k != "tools"})

    cases = [(fake_server(tool_reply, model="fake-teacher"), True, "rendered"),
             (fake_server(tool_reply, model="fake-teacher", tool_calling=False), False, "rejects requests with tools"),
             (NoRender(plain_model, model="fake-teacher").start(), False, "ignores tools")]
    try:
        for srv, native, why in cases:
            cache = ResponseCache(tmp_path / f"{native}-{why[:4]}.sqlite")
            backend = CachedBackend(HttpBackend(TeacherConfig(**fast_teacher([srv.base_url]))), cache)
            verdict = run(tool_support(backend))
            assert verdict.native is native and why in verdict.reason
            n = srv.stats.n_requests
            assert run(tool_support(backend)) is verdict and srv.stats.n_requests == n      # once per backend
            run(backend.close())
            cache.commit()
            later = CachedBackend(HttpBackend(TeacherConfig(**fast_teacher(["http://127.0.0.1:9/v1"]))), cache)
            assert run(tool_support(later)) == verdict                                 # from the cache, no server
    finally:
        cases[2][0].stop()


# ---- in-process vLLM adapter ---------------------------------------------------------------------

class ToolLLM:
    """`vllm.LLM.chat` stand-in: writes a Hermes call when tools are given."""

    def __init__(self):
        self.chat_kw: list[dict] = []

    def chat(self, messages, sampling_params, use_tqdm=False, **chat_kw):
        self.chat_kw.append(chat_kw)
        text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
                if chat_kw.get("tools") else "no tools")
        return [SimpleNamespace(outputs=[SimpleNamespace(text=text, token_ids=[1, 2], logprobs=None, finish_reason="stop")],
                                prompt_token_ids=[1]) for _ in messages]


def test_in_process_vllm_renders_tools_and_parses_calls():
    llm = ToolLLM()
    backend = VllmBackend(TeacherConfig(model="m", backend="vllm"), llm_factory=lambda: (llm, dict))
    tooled = ChatRequest(messages=ASK, seed=1, tools=[WEATHER])
    plain = ChatRequest(messages=ASK, seed=2)
    forced = ChatRequest(messages=ASK, seed=3, tools=[WEATHER], tool_choice="required")

    async def go():
        await backend.start()
        out = await asyncio.gather(backend.complete(tooled), backend.complete(plain), backend.complete(forced),
                                   return_exceptions=True)
        again = await backend.complete(tooled)
        await backend.close()
        return out, again
    (t, p, f), again = run(go())
    assert t.tool_calls == [{"id": t.tool_calls[0]["id"], "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert t.finish_reason == "tool_calls" and t.content == "" and again.tool_calls == t.tool_calls   # stable ids
    assert p.content == "no tools" and p.tool_calls is None
    assert isinstance(f, ValueError) and "needs a server" in str(f)
    assert sorted(bool(kw.get("tools")) for kw in llm.chat_kw[:2]) == [False, True]       # separate LLM.chat calls
