"""The tool-use generators end to end on the engine against a scripted teacher over real HTTP.

General pipeline, by both tool protocols (native OpenAI tool calling, where the scripted server
parses the model's `<tool_call>` text as vLLM's hermes parser does or answers with explicit
`tool_calls`; and the prompted Hermes layout): three conversation types accepted, and each
rejection path (query, gate, tool verifier with a bad argument, an unknown tool, malformed call
JSON and non-JSON arguments, tool simulator, turn judge, rules, trajectory judge); both paths give
the same records and rejections. `auto` takes native where the endpoint renders tools and
prompted where it rejects them. Conversational pipeline: policy/tools refinement, scenario
checks, k rollouts per scenario, outcome/process verification and the neither-always-nor-never
filter."""

from __future__ import annotations

import json
import re

import pytest

from synth.domains.seeds import load_personas, load_toolsets, load_topics
from synth.domains.tool_sim import parse_assistant_turn, to_prompt_messages
from synth.domains.tool_use import sample_tasks
from synth.domains.tool_validate import conversation_problems

MARK = re.compile(r"\[([a-z]+(?:-[a-z]+)+)\]")


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def first_user(req):
    return next(m["content"] for m in req["messages"] if m["role"] == "user")


def n_results(req):
    """Tool results so far, whichever protocol carries them (tool messages or <tool_response> blocks)."""
    return sum(m["content"].count("<tool_response>") for m in req["messages"] if m["role"] == "user") \
        + sum(1 for m in req["messages"] if m["role"] == "tool")


def assistant_reply(text, req):
    mark = MARK.search(first_user(req)).group(1)
    done = n_results(req)
    users = [m["content"] for m in req["messages"] if m["role"] == "user" and "<tool_response>" not in m["content"]]
    native = "tools" in req
    if mark == "bad-json":          # a call block that is not JSON: vLLM's parser leaves it in the content
        return '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Oslo",\n</tool_call>'
    if mark == "args-text":         # arguments that are not JSON text
        if native:
            return {"tool_calls": [{"name": "get_forecast", "arguments": "{city: Oslo}"}]}
        return '<tool_call>\n{"name": "get_forecast", "arguments": "{city: Oslo}"}\n</tool_call>'
    if mark == "good-single" and native and done == 0:     # explicit tool_calls, as a server that parsed them
        return {"tool_calls": [{"name": "get_current_weather", "arguments": {"units": "metric", "city": "Lisbon"}}]}
    if mark == "bad-args":
        return call("get_forecast", city="Oslo", days="3")
    if mark == "unknown-tool":
        return call("get_stock_price", ticker="NVDA")
    if mark == "good-multistep":
        return [call("get_current_weather", city="Lisbon"), call("find_recipes", ingredients=["chickpeas"]),
                "It is raining in Lisbon (14 C); chana masala is a good dish tonight."][min(done, 2)]
    if mark == "good-multiturn":
        if len(users) == 1:
            return call("get_current_weather", city="Lisbon") if done == 0 else "Lisbon: 14 C and rain."
        return call("get_current_weather", city="Porto") if done == 1 else "Porto: 12 C and cloudy."
    if mark == "rules-fail":        # claims multi-step but answers after one call
        return call("get_current_weather", city="Lisbon") if done == 0 else "Rainy. Cook soup."
    return call("get_current_weather", city="Lisbon", units="metric") if done == 0 else "It is 14 C and raining in Lisbon."


def tool_reply(text, req):
    if "[tool-nonjson]" in text:
        return "sunny, 20 degrees"
    if '"find_recipes"' in text:
        return '```json\n{"recipes": [{"id": "r1", "name": "Chana masala"}]}\n```'
    city = "Porto" if "Porto" in text.split("The call:")[-1] else "Lisbon"
    return json.dumps({"city": city, "temp_c": 14 if city == "Lisbon" else 12, "condition": "rain"})


def query_reply(text, req):
    mark = MARK.search(text).group(1)
    if mark == "short-query":
        return "hi"
    return f'"What is the weather in Lisbon today? [{mark}]"'


def verdict(ok, why="ok"):
    return json.dumps({"verdict": "PASS" if ok else "FAIL", "reason": why})


@pytest.fixture
def tool_script(script):
    script.on("They can ask an AI assistant for help", reply=query_reply, name="query")
    script.on("You check tasks for a tool-use dataset", reply=lambda t, r: verdict("[gate-fail]" not in t, "off-topic"), name="gate")
    script.on("You can call these functions", reply=assistant_reply, system=True, name="assistant")
    script.on("You are a helpful assistant.", reply=assistant_reply, system=True, name="assistant_native")
    script.on("What is the weather in Paris right now?", reply="Let me check.", name="probe")
    script.on("You simulate the API behind the function", reply=tool_reply, name="tool")
    script.on("Write this person's next message", reply=lambda t, r: "[DONE]" if "Porto" in t else "And in Porto?", name="followup")
    script.on("You review one assistant turn", reply=lambda t, r: verdict("[turn-fail]" not in t, "invented argument"), name="turn")
    script.on("You review a complete tool-use conversation", reply=lambda t, r: verdict("[traj-fail]" not in t, "incomplete"), name="trajectory")
    return script


CASES = {  # marker -> (conversation type, step that rejects it or None)
    "good-single": ("single_turn", None), "good-multistep": ("multi_step", None), "good-multiturn": ("multi_turn", None),
    "short-query": ("single_turn", "query"), "gate-fail": ("single_turn", "query_gate"),
    "bad-args": ("single_turn", "simulate"), "unknown-tool": ("single_turn", "simulate"),
    "bad-json": ("single_turn", "simulate"), "args-text": ("single_turn", "simulate"),
    "tool-nonjson": ("single_turn", "simulate"), "turn-fail": ("single_turn", "simulate"),
    "rules-fail": ("multi_step", "rules"), "traj-fail": ("single_turn", "trajectory_judge"),
}


def tool_items():
    ts = {t.id: t for t in load_toolsets()}
    tools = ts["weather"].tools + ts["recipes"].tools
    return [{"id": m, "prompt": m, "toolset_ids": ["weather", "recipes"], "tools": tools, "persona_id": "p-test",
             "persona": f"A test person [{m}]", "conversation_type": ctype, "topic": "the weather", "category": "tool_calling"}
            for m, (ctype, _) in CASES.items()]


def run_tool_use(run_gen, url, out, protocol):
    return run_gen("tool_use", url, out, source={"kind": "inline", "items": tool_items()},
                   step_updates={"simulate": {"tool_protocol": protocol}})


def rejects_by_prompt(jsonl, res):
    rejects = {}
    for rj in jsonl(res.out_dir / "rejects.jsonl"):
        rejects.setdefault(rj["prompt_id"], []).append((rj["step"], rj["reason"]))
    return rejects


@pytest.mark.parametrize("protocol", ["native", "prompted"])
def test_general_tool_use_accepts_valid_conversations_and_names_every_rejection(protocol, tool_script, teacher, run_gen,
                                                                                tmp_path, jsonl):
    res = run_tool_use(run_gen, teacher.base_url, tmp_path / "run", protocol)
    assert tool_script.unmatched == []
    assert tool_script.hits.get("assistant" if protocol == "prompted" else "assistant_native")
    assert not tool_script.hits.get("assistant_native" if protocol == "prompted" else "assistant")
    assistant_bodies = [b for b in teacher.stats.bodies if "tools" in b]
    if protocol == "native":         # the wire format: tools, tool_choice, tool_calls and tool results round-trip
        assert assistant_bodies and all(b["tool_choice"] == "auto" and len(b["tools"]) == 7 for b in assistant_bodies)
        later = [b for b in assistant_bodies if any(m["role"] == "tool" for m in b["messages"])]
        assert later and all(m["tool_call_id"].startswith("call_") for b in later for m in b["messages"] if m["role"] == "tool")
        assert all("<tools>" not in b["messages"][0]["content"] for b in assistant_bodies)
    else:
        assert not assistant_bodies
    records = jsonl(res.records_path)
    assert sorted(r["prompt_id"] for r in records) == ["good-multistep", "good-multiturn", "good-single"]
    for r in records:
        meta = r["meta"]
        assert r["schema"] == "synth-record/2" and meta["tool_protocol"] == protocol and "tools" not in meta
        assert meta["schema_violations"] == 0 and meta["trajectory_judgement"]["pass"] and meta["query_gate"]["pass"]
        assert meta["turn_judgements"] and all(t["pass"] for t in meta["turn_judgements"])
        assert len(r["tools"]) == 7 and meta["persona_id"] == "p-test"
        v = conversation_problems(r["messages"], r["tools"], conversation_type=meta["conversation_type"])
        assert v.ok, v.problems()
        calls = [c for m in r["messages"] if m["role"] == "assistant" for c in (m["tool_calls"] or [])]
        assert calls and all(c["type"] == "function" and isinstance(c["function"]["arguments"], str) for c in calls)
        assert [c["id"] for c in calls] == [f"call_{i}" for i in range(1, len(calls) + 1)]
        assert all(m["tool_call_id"] for m in r["messages"] if m["role"] == "tool")
    single = next(r for r in records if r["prompt_id"] == "good-single")
    assert single["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Lisbon", "units": "metric"}'
    multi = next(r for r in records if r["prompt_id"] == "good-multiturn")
    assert [m["role"] for m in multi["messages"]].count("user") == 2
    rejects = rejects_by_prompt(jsonl, res)
    for mark, (_, step) in CASES.items():
        if step is None:
            assert mark not in rejects
        else:
            assert [s for s, _ in rejects[mark]] == [step], (mark, rejects.get(mark))
    assert "is not of type 'integer'" in rejects["bad-args"][0][1]
    assert "not among the exposed tools" in rejects["unknown-tool"][0][1]
    assert "tool call block is not a JSON object" in rejects["bad-json"][0][1]
    assert "arguments are not valid JSON" in rejects["args-text"][0][1]
    assert "tool simulator" in rejects["tool-nonjson"][0][1]
    assert rejects["turn-fail"][0][1].startswith("turn judge")
    assert "follows an earlier tool result" in rejects["rules-fail"][0][1]
    steps = res.manifest.steps
    assert steps["simulate.tool_verifier"]["in"] > steps["simulate.tool_verifier"]["out"]
    assert steps["simulate.turn_judge"]["acceptance"] < 1 and steps["simulate.tool_response"]["acceptance"] < 1
    assert (steps["query"]["in"], steps["query"]["out"]) == (13, 12)
    assert steps["format"]["out"] == 3


def test_native_and_prompted_tool_calls_give_the_same_records_and_rejections(tool_script, teacher, run_gen, tmp_path, jsonl):
    runs = {p: run_tool_use(run_gen, teacher.base_url, tmp_path / p, p) for p in ("native", "prompted")}
    recs = {p: jsonl(r.records_path) for p, r in runs.items()}
    for r in recs["native"] + recs["prompted"]:
        r["meta"].pop("tool_protocol")
    assert recs["native"] == recs["prompted"]
    assert rejects_by_prompt(jsonl, runs["native"]) == rejects_by_prompt(jsonl, runs["prompted"])
    steps = {p: {k: v for k, v in r.manifest.steps.items()} for p, r in runs.items()}
    assert steps["native"] == steps["prompted"]


def test_auto_protocol_is_native_where_tools_are_served_and_prompted_where_rejected(tool_script, run_gen, tmp_path, jsonl):
    from synth.fakeserver import FakeOpenAIServer

    for tool_calling, want in ((True, "native"), (False, "prompted")):
        with FakeOpenAIServer(tool_script, model="teacher", tool_calling=tool_calling) as srv:
            res = run_tool_use(run_gen, srv.base_url, tmp_path / want, "auto")
            probes = [b for b in srv.stats.bodies if b["messages"][-1]["content"] == "What is the weather in Paris right now?"]
            assert len(probes) == 2                      # one probe per run (with and without tools), not per prompt
        records = jsonl(res.records_path)
        assert len(records) == 3 and {r["meta"]["tool_protocol"] for r in records} == {want}
        # a rerun from the cache needs no server: the probe's verdict (a rejection is no cached
        # answer) is cached with the answers
        (tmp_path / want / "journal.jsonl").unlink()
        again = run_tool_use(run_gen, "http://127.0.0.1:9/v1", tmp_path / want, "auto")
        assert again.manifest.usage["requests"] == again.manifest.usage["cached"] > 0
        assert jsonl(again.records_path) == records


def test_task_sampling_respects_the_tool_cap_and_types():
    tasks = sample_tasks(5, 300, load_toolsets(), load_personas(), load_topics(), max_tools=15, max_toolsets=4)
    assert tasks == sample_tasks(5, 300, load_toolsets(), load_personas(), load_topics(), max_tools=15, max_toolsets=4)
    assert max(len(t["tools"]) for t in tasks) == 15 and min(len(t["tools"]) for t in tasks) >= 2
    assert {t["conversation_type"] for t in tasks} == {"single_turn", "multi_step", "multi_turn"}
    topics = load_topics()
    assert all(t["topic"] in topics[t["conversation_type"]] for t in tasks)
    names = {t["function"]["name"] for ts in load_toolsets() if ts.id in tasks[0]["toolset_ids"] for t in ts.tools}
    assert {t["function"]["name"] for t in tasks[0]["tools"]} <= names


def test_prompted_tool_calls_round_trip_to_openai_format():
    ids = iter(f"call_{i}" for i in range(1, 10))
    turn = parse_assistant_turn('Let me check.\n<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>\n'
                                '<tool_call>{"name": "get_air_quality", "arguments": {"city": "Oslo"}}</tool_call>'
                                "<tool_call>not json</tool_call>", lambda: next(ids))
    assert turn.content == "Let me check."
    assert [c["function"]["name"] for c in turn.calls] == ["get_forecast", "get_air_quality"]
    assert json.loads(turn.calls[0]["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert turn.problems and "not a JSON object" in turn.problems[0]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": turn.calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "{}"}, {"role": "tool", "tool_call_id": "call_2", "content": "{}"}]
    prompt = to_prompt_messages("SYS", msgs)
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[2]["content"].count("<tool_call>") == 2 and prompt[3]["content"].count("<tool_response>") == 2


def test_native_tool_calls_become_the_same_turn_as_prompted_text():
    from synth.domains.tool_sim import native_assistant_turn, to_native_messages

    text = ('<tool_call>\n{"name": "get_forecast", "arguments": {"days": 2, "city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_air_quality", "arguments": {"city": "Oslo"}}\n</tool_call>')
    prompted = parse_assistant_turn(text, iter(["call_1", "call_2"]).__next__)
    server_calls = [{"id": "chatcmpl-tool-9f", "type": "function", "function": {"name": "get_forecast", "arguments": '{"days": 2, "city": "Oslo"}'}},
                    {"id": "chatcmpl-tool-a0", "type": "function", "function": {"name": "get_air_quality", "arguments": '{"city": "Oslo"}'}}]
    native = native_assistant_turn(None, server_calls, iter(["call_1", "call_2"]).__next__)
    assert native == prompted and native.calls[0]["function"]["arguments"] == '{"city": "Oslo", "days": 2}'
    # what a server's parser left unparsed in the content is parsed as prompted text is
    residue = native_assistant_turn('Checking. <tool_call>{"name": "get_forecast", "arguments": {"city": "Oslo"}}</tool_call>'
                                    "<tool_call>{oops</tool_call>", None, iter(["call_1"]).__next__)
    assert residue.content == "Checking." and [c["function"]["name"] for c in residue.calls] == ["get_forecast"]
    assert residue.problems and "not a JSON object" in residue.problems[0]
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": native.calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "{}"}, {"role": "tool", "tool_call_id": "call_2", "content": "{}"},
            {"role": "assistant", "content": None}]
    wire = to_native_messages("SYS", msgs)
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert wire[2]["tool_calls"] == native.calls and wire[3] == {"role": "tool", "tool_call_id": "call_1", "content": "{}"}
    assert wire[5]["content"] == ""


# ---- conversational pipeline -----------------------------------------------------------------------

SCENARIOS = [
    {"persona": "Member M000123 [sometimes]", "background": "Loan L1 is due tomorrow.", "inquiry": "Renew loan L1.",
     "expected_outcome": "Loan L1 renewed.", "expected_actions": [{"name": "renew_loan", "arguments": {"loan_id": "L1"}}]},
    {"persona": "Member M000456 [always]", "background": "Wants a hold on T9.", "inquiry": "Place a hold on T9.",
     "expected_outcome": "Hold placed.", "expected_actions": [{"name": "place_hold", "arguments": {"title_id": "T9"}}]},
    {"persona": "Member M000789", "background": "x", "inquiry": "Fly me to Rome.", "expected_outcome": "y",
     "expected_actions": [{"name": "book_flight", "arguments": {}}]},
]


def cs_agent(text, req):
    user = first_user(req)
    done = n_results(req)
    if "T9" in user:
        return call("place_hold", member_id="M000456", title_id="T9") if done == 0 else "Your hold on T9 is placed."
    if done == 0:
        # this scenario's agent sometimes renews the wrong loan: a failed rollout
        return call("renew_loan", member_id="M000123", loan_id="L1" if req["seed"] % 2 == 0 else "L2")
    return "Your loan is renewed."


def cs_customer(text, req):
    if "ASSISTANT:" in text:
        return "[DONE]"
    return "Hello, please renew my loan L1, member M000123." if "L1" in text else "Hi, a hold on T9 for M000456 please."


def cs_judge(text, req):
    return verdict(True, "fine")


@pytest.fixture
def cs_script(script):
    script.on("Propose one new, more specialized area", reply="Overdue renewals", name="subdomain")
    script.on("You check customer-service setups", reply=lambda t, r: verdict(True), name="setup_judge")
    script.on("Write 3 different customer scenarios", reply=json.dumps(SCENARIOS), name="scenarios")
    script.on("You are a customer contacting", reply=cs_customer, name="customer")
    script.on("You can call these functions", reply=cs_agent, system=True, name="agent")
    script.on("You are a customer-service agent", reply=cs_agent, system=True, name="agent_native")
    script.on("What is the weather in Paris right now?", reply="Let me check.", name="probe")
    script.on("You simulate the API behind the function", reply='{"status": "ok"}', name="env")
    script.on("You review a customer-service conversation", reply=cs_judge, name="outcome")
    script.on("You review how a customer-service agent worked", reply=cs_judge, name="process")
    return script


@pytest.mark.parametrize("protocol", ["native", "prompted"])
def test_conversational_pipeline_keeps_scenarios_solved_neither_always_nor_never(protocol, cs_script, teacher, run_gen,
                                                                                 tmp_path, jsonl):
    k = 8
    res = run_gen("tool_use_conversational", teacher.base_url, tmp_path / "cs",
                  overrides=["source.per_domain=1", "source.domains=[library]"],
                  step_updates={"rollouts": {"k": k, "tool_protocol": protocol}})
    assert cs_script.unmatched == []
    assert cs_script.hits.get("agent_native" if protocol == "native" else "agent")
    assert not cs_script.hits.get("agent" if protocol == "native" else "agent_native")
    steps = res.manifest.steps
    assert (steps["scenarios"]["in"], steps["scenarios"]["out"]) == (3, 2)        # book_flight is no library tool
    assert steps["rollouts"]["in"] == 2 * k                                        # exactly k per scenario
    records = jsonl(res.records_path)
    assert records, "the 'sometimes' scenario must yield its successful rollouts"
    for r in records:
        m = r["meta"]
        assert m["scenario"]["persona"].endswith("[sometimes]") and m["k"] == k and m["tool_protocol"] == protocol
        assert 0 < m["successes"] < k and m["outcome_judgement"]["pass"] and m["process_judgement"]["pass"]
        assert r["messages"][0]["role"] == "system" and "renew a loan at most twice" in r["messages"][0]["content"]
        assert {t["function"]["name"] for t in r["tools"]} >= {"renew_loan", "place_hold"} and "tools" not in m
        assert conversation_problems(r["messages"], r["tools"], conversation_type=None).ok
    # identical successful rollouts are exact duplicates, which the engine's clean step removes
    dups = [x for x in jsonl(res.out_dir / "removals.jsonl") if x["reason"] == "exact_duplicate"]
    assert len(records) + len(dups) == records[0]["meta"]["successes"]
    rejects = jsonl(res.out_dir / "rejects.jsonl")
    assert any("solved 8/8 times: always" in rj["reason"] for rj in rejects)
    assert any("expected tool calls not made: renew_loan" in rj["reason"] for rj in rejects)
    assert steps["select"]["in"] == 2 and steps["select"]["out"] == 1


def test_generated_setups_are_refined_when_their_checks_fail(script, teacher, run_gen, tmp_path, jsonl):
    bad = 'Policy:\n1. Be nice.\nTools:\n```json\n[{"type": "function", "function": {"name": "bad name"}}]\n```'
    good_tools = [{"type": "function", "function": {"name": n, "description": f"{n} tool",
                                                    "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}}}
                  for n in ("lookup_account", "change_plan", "refund_fee")]
    good = ("Policy:\n1. Verify the account id before any change.\n2. Refund fees only once a year.\n3. Plan changes take effect next cycle.\n"
            f"Tools:\n```json\n{json.dumps(good_tools)}\n```")
    script.on("Propose one new, more specialized area", reply="Roaming charge disputes", name="subdomain")
    script.on("Problems found:", reply=good, name="refine")
    script.on("You design the customer-service setup", reply=bad, name="draft")
    script.on("You check customer-service setups", reply=lambda t, r: verdict(True), name="setup_judge")
    script.on("customer scenarios", reply="no scenarios today", name="scenarios")
    res = run_gen("tool_use_conversational", teacher.base_url, tmp_path / "refine",
                  overrides=["source.per_domain=1", "source.domains=[telecom]"], step_updates={"rollouts": {"k": 2}})
    assert script.hits["draft"] == 1 and script.hits["refine"] == 1 and script.hits["setup_judge"] == 1
    assert res.manifest.steps["policy_tools"]["out"] == 1
    rejects = jsonl(res.out_dir / "rejects.jsonl")
    assert [rj["step"] for rj in rejects] == ["scenarios"] and "not a JSON array" in rejects[0]["reason"]


def test_simulation_can_feed_a_bad_call_back_to_the_tool_model():
    """With stop_on_violation off, the Tool model sees the faulty call (its rubric returns an
    error) and the assistant may recover; the violation is still recorded."""
    import asyncio

    from synth.domains import tool_sim
    from synth.domains.seeds import load_toolsets

    tools = next(t for t in load_toolsets() if t.id == "weather").tools
    replies = iter([call("get_forecast", city="Oslo", days="3"), call("get_forecast", city="Oslo", days=3), "Mild all week."])

    async def assistant(msgs, key):
        return next(replies)

    async def tool_model(c, msgs, key):
        args = json.loads(c["function"]["arguments"])
        return json.dumps({"error": "days must be an integer"} if isinstance(args["days"], str) else {"days": [12, 13, 11]})

    opts = tool_sim.SimOptions(stop_on_violation=False, turn_judge=False, max_steps_per_turn=4)
    sim = asyncio.run(tool_sim.simulate(tools=tools, system="S", first_user="Forecast for Oslo?", opts=opts,
                                        assistant=assistant, tool_model=tool_model))
    assert sim.ok and len(sim.schema_violations) == 1 and "is not of type 'integer'" in sim.schema_violations[0]
    assert json.loads(sim.messages[2]["content"]) == {"error": "days must be an integer"}
    assert sim.stage_counts["tool_verifier"] == [2, 1]
    assert tool_sim.expected_actions_met(sim.messages, [{"name": "get_forecast", "arguments": {"days": 3}}]) == []
    assert tool_sim.expected_actions_met(sim.messages, [{"name": "get_forecast", "arguments": {"days": 5}}]) == [
        'get_forecast({"days": 5})']
