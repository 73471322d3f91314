"""MCP tools in the tool-use generator: a real MCP server (tests/synth/mcp_tools_server.py, over
stdio and over streamable HTTP on 127.0.0.1) lists the tools, the rollout calls them for real
through the `mcp` client, results become tool messages, the Tool Verifier judges the calls, and
tool errors and timeouts become rejects with their reasons."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synth.domains.mcp_tools import McpServerConfig, openai_tool, result_content
from synth.engine import load_generator, run
from synth.fakeserver import Script, ScriptedResponder
from synth.pipeline import GeneratorConfig
from synth.servers import free_port

SERVER = Path(__file__).resolve().parents[1] / "mcp_tools_server.py"
REPO = Path(__file__).resolve().parents[3]

# the teacher: a user who asks, judges that pass, and an assistant whose call depends on the
# tools it was given (the first of these it sees), then answers from the tool's result
TEACHER = Script.model_validate({"rules": [
    {"name": "judge", "match": '"verdict": "PASS" or "FAIL"', "reply": '{"verdict": "PASS", "reason": "fine"}'},
    {"name": "query", "match": "Write the first message this person sends",
     "reply": "Please work this out for me with your tools, thanks a lot."},
    {"name": "followup", "match": "next message", "reply": "[DONE]"},
    {"name": "answer", "tools": True, "where": "last", "match": r"^\{", "reply": "Here is what the tool returned."},
    # which call the assistant makes, by the tools the task exposes (seed 0's tasks get all four cases)
    {"name": "bad_order", "tools": True, "where": "tools", "match": '^(?!.*"add").*"lookup_order"',
     "tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "B-2"}}]},
    {"name": "count", "tools": True, "where": "tools", "match": '^(?!.*"lookup_order").*"word_count"',
     "tool_calls": [{"name": "word_count", "arguments": {"words": "not the schema"}}]},
    {"name": "slow", "tools": True, "where": "tools", "match": '^(?!.*"word_count").*"lookup_order".*"slow_report"',
     "tool_calls": [{"name": "slow_report", "arguments": {"seconds": 60}}]},
    {"name": "add", "tools": True, "where": "tools", "match": '"add"',
     "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
]})


def tool_use_config(url: str, tools: dict, n: int = 8) -> GeneratorConfig:
    data = load_generator("tool_use").model_dump(mode="json")
    for t in data["teachers"].values():
        t.update(endpoints=[url], model="fake-teacher", backoff_base_s=0.01, ready_timeout_s=10)
    data["source"].update(n=n, tools=tools, type_weights={"single_turn": 1.0})
    for step in data["steps"]:
        if step["kind"] == "tool_simulate":
            step["tool_protocol"] = "native"
    return GeneratorConfig.model_validate(data)


def check_run(res, out: Path, teacher: ScriptedResponder, srv) -> None:
    """Every task ends as a record whose tool message is the real result, or a reject that says
    why: a tool error, a timeout, or the Tool Verifier (a call outside the schema never reaches
    the server)."""
    assert res.manifest.status == "complete"
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert records, rejects
    for r in records:
        tool_msgs = [m for m in r["messages"] if m["role"] == "tool"]
        assert tool_msgs and json.loads(tool_msgs[0]["content"]) == {"result": 5}      # add(2, 3), computed
        assert r["meta"]["simulator_model"].startswith("mcp:")
    reasons = [rj["reason"] for rj in rejects]
    assert any("tool slow_report timed out after 3 s" in x for x in reasons), reasons
    assert any("tool lookup_order returned an error" in x for x in reasons), reasons
    # nothing was simulated: no request asked the Tool model for an answer
    assert not any("You simulate the API" in json.dumps(b) for b in srv.stats.bodies)
    # the same conversation for every task that called add: `clean` keeps one of them
    removed = [json.loads(x) for x in (out / "removals.jsonl").read_text().splitlines()]
    assert teacher.hits["answer"] == teacher.hits["add"] == len(records) + len(removed) == 4
    assert any(x.startswith("tool verifier") and "word_count" in x for x in reasons), reasons


def wait_port(port: int, timeout_s: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"MCP server on port {port} did not start")


def test_mcp_pieces():
    assert openai_tool("add", "Add.", {"type": "object", "title": "addArguments", "properties": {}}) == \
        {"type": "function", "function": {"name": "add", "description": "Add.",
                                          "parameters": {"type": "object", "properties": {}}}}
    assert result_content({"words": 3}, ["ignored"]) == '{"words": 3}'
    assert result_content(None, ['{"a": 1}']) == '{"a": 1}'
    assert result_content(None, ["plain"]) == '{"result": "plain"}'
    with pytest.raises(ValueError, match="exactly one of command"):
        McpServerConfig.model_validate({"command": ["x"], "url": "http://127.0.0.1:1/mcp"})


def test_tool_use_calls_a_stdio_mcp_server_for_real(fake_server, tmp_path):
    teacher = ScriptedResponder(TEACHER)
    srv = fake_server(teacher)
    tools = {"mcp": {"command": [sys.executable, str(SERVER), "stdio"], "timeout_s": 3}}
    res = run(tool_use_config(srv.base_url, tools), tmp_path / "r", progress=False)
    check_run(res, tmp_path / "r", teacher, srv)


def test_tool_use_calls_a_streamable_http_mcp_server(fake_server, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        teacher = ScriptedResponder(TEACHER)
        srv = fake_server(teacher)
        tools = {"mcp": {"url": f"http://127.0.0.1:{port}/mcp", "timeout_s": 3}}
        res = run(tool_use_config(srv.base_url, tools), tmp_path / "r", progress=False)
        check_run(res, tmp_path / "r", teacher, srv)
    finally:
        proc.terminate()
        proc.wait(10)
