"""Tool-call and conversation validators on real toolsets: valid calls pass, each kind of invalid
call or conversation is rejected with a reason."""

from __future__ import annotations

import json

import pytest

from purokit.errors import ContractError
from synth.domains.seeds import load_toolsets
from synth.domains.tool_validate import (
    conversation_problems,
    tool_call_problems,
    tool_definition_problems,
    tools_by_name,
)


@pytest.fixture(scope="module")
def toolsets():
    return {t.id: t for t in load_toolsets()}


def call(name, args, cid="call_1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def test_shipped_toolsets_are_valid_openai_tool_definitions(toolsets):
    assert len(toolsets) >= 8
    for ts in toolsets.values():
        assert tool_definition_problems(ts.tools) == []
        assert all(t["type"] == "function" for t in ts.tools)


@pytest.mark.parametrize("name,args", [
    ("get_current_weather", {"city": "Lisbon"}),
    ("get_current_weather", {"city": "Lisbon", "country_code": "PT", "units": "metric"}),
    ("get_forecast", {"city": "Oslo", "days": 7}),
    ("cancel_order", {"order_id": "ORD-123456", "reason": "changed_mind"}),
    ("start_return", {"order_id": "ORD-00042", "item_skus": ["SKU-1", "SKU-2"], "refund_method": "store_credit"}),
    ("transfer_funds", {"from_account": "savings", "to_account": "checking", "amount": 250.5}),
    ("create_event", {"title": "Dentist", "date": "2025-03-04", "start_time": "09:30", "duration_minutes": 45}),
])
def test_valid_calls_pass(toolsets, name, args):
    exposed = tools_by_name(t for ts in toolsets.values() for t in ts.tools)
    assert tool_call_problems(call(name, args), exposed) == []


@pytest.mark.parametrize("name,args,why", [
    ("get_stock_price", {"ticker": "NVDA"}, "not among the exposed tools"),
    ("get_forecast", {"city": "Oslo"}, "'days' is a required property"),
    ("get_forecast", {"city": "Oslo", "days": "3"}, "is not of type 'integer'"),
    ("get_forecast", {"city": "Oslo", "days": 10}, "10 is greater than the maximum of 7"),
    ("get_current_weather", {"city": "Lisbon", "units": "kelvin"}, "is not one of ['metric', 'imperial']"),
    ("get_current_weather", {"city": "Lisbon", "country_code": "Portugal"}, "does not match"),
    ("get_current_weather", {"city": "Lisbon", "lang": "pt"}, "Additional properties are not allowed ('lang'"),
    ("cancel_order", {"order_id": "<order_id>", "reason": "other"}, "does not match"),
    ("search_products", {"query": "<product name>"}, "placeholder"),
    ("search_products", {"query": "string"}, "placeholder"),
    ("get_forecast", '{"city": "Oslo", "days": 3', "not valid JSON"),
    ("get_forecast", '["Oslo", 3]', "must be a JSON object"),
    ("transfer_funds", {"from_account": "savings", "to_account": "checking", "amount": 0}, "less than or equal to the minimum"),
    ("start_return", {"order_id": "ORD-00042", "item_skus": []}, "should be non-empty"),
    ("get_air_quality", {"city": "  "}, "required argument 'city' is empty"),
])
def test_invalid_calls_are_rejected_with_a_reason(toolsets, name, args, why):
    exposed = tools_by_name(t for ts in toolsets.values() for t in ts.tools)
    problems = tool_call_problems(call(name, args), exposed)
    assert problems and any(why in p for p in problems), problems


def test_a_real_function_outside_the_exposed_subset_is_rejected(toolsets):
    exposed = tools_by_name(toolsets["weather"].tools)
    problems = tool_call_problems(call("cancel_order", {"order_id": "ORD-12345", "reason": "other"}), exposed)
    assert problems and "not among the exposed tools" in problems[0]


def test_broken_tool_definitions_are_reported():
    bad = [
        {"type": "function", "function": {"name": "ok_tool", "description": "x", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "ok_tool", "description": "dup", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "has space", "description": "x"}},
        {"type": "function", "function": {"name": "bad_schema", "description": "x", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}},
        {"type": "function", "function": {"name": "bad_required", "description": "x", "parameters": {"type": "object", "properties": {}, "required": ["a"]}}},
        {"type": "retrieval"},
    ]
    problems = "\n".join(tool_definition_problems(bad))
    for why in ("duplicate function name", "name must match", "not a valid JSON schema", "required parameter 'a'", "expected {'type': 'function'"):
        assert why in problems


def test_a_toolset_file_with_an_invalid_tool_fails_with_file_and_field(tmp_path):
    p = tmp_path / "ts.yaml"
    p.write_text("schema: toolsets/1\ntoolsets:\n  - id: x\n    tools:\n      - type: function\n        function: {name: f}\n")
    with pytest.raises(ContractError) as e:
        load_toolsets(p)
    assert str(p) in str(e.value) and "toolsets.0" in str(e.value) and "missing description" in str(e.value)


# ---- conversations -------------------------------------------------------------------------

def conv_multi_step():
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Lisbon, and if it rains, find me recipes with chickpeas?"},
        {"role": "assistant", "content": None, "tool_calls": [call("get_current_weather", {"city": "Lisbon"}, "c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"condition": "rain", "temp_c": 14})},
        {"role": "assistant", "content": "", "tool_calls": [call("find_recipes", {"ingredients": ["chickpeas"]}, "c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": json.dumps({"recipes": [{"id": "r1", "name": "Chana masala"}]})},
        {"role": "assistant", "content": "It's raining (14°C). Try chana masala."},
    ]


def tools_for(toolsets, *ids):
    return [t for i in ids for t in toolsets[i].tools]


def test_a_valid_multi_step_conversation_passes(toolsets):
    v = conversation_problems(conv_multi_step(), tools_for(toolsets, "weather", "recipes"), conversation_type="multi_step")
    assert v.ok, v.problems()
    assert (v.n_tool_calls, v.n_steps, v.n_user_turns, v.schema_violations) == (2, 2, 1, 0)


def test_parallel_calls_in_one_turn_are_not_multi_step(toolsets):
    msgs = [
        {"role": "user", "content": "Weather in Lisbon and Porto?"},
        {"role": "assistant", "content": None, "tool_calls": [call("get_current_weather", {"city": "Lisbon"}, "a"),
                                                              call("get_current_weather", {"city": "Porto"}, "b")]},
        {"role": "tool", "tool_call_id": "a", "content": "{\"temp_c\": 14}"},
        {"role": "tool", "tool_call_id": "b", "content": "{\"temp_c\": 12}"},
        {"role": "assistant", "content": "Lisbon 14°C, Porto 12°C."},
    ]
    tools = tools_for(toolsets, "weather")
    assert conversation_problems(msgs, tools, conversation_type="single_turn").ok
    v = conversation_problems(msgs, tools, conversation_type="multi_step")
    assert not v.ok and "no tool call that follows an earlier tool result" in v.problems()[0]


@pytest.mark.parametrize("mutate,why", [
    (lambda m: m.pop(3), "before the results of calls ['c1']"),
    (lambda m: m[3].update(tool_call_id="zzz"), "no pending call has"),
    (lambda m: m[5].update(content="sunny, 20 degrees"), "is not JSON"),
    (lambda m: m.pop(), "must end with an assistant answer"),
    (lambda m: m[4]["tool_calls"][0].update(id="c1"), "duplicate tool call id"),
    (lambda m: m[4]["tool_calls"][0]["function"].update(arguments='{"ingredients": "chickpeas"}'), "is not of type 'array'"),
    (lambda m: m.insert(1, {"role": "system", "content": "again"}), "system message may only come first"),
    (lambda m: m[4]["tool_calls"].append(dict(m[4]["tool_calls"][0], id="c3")), "the same call twice"),
])
def test_broken_conversations_are_rejected(toolsets, mutate, why):
    msgs = conv_multi_step()
    mutate(msgs)
    v = conversation_problems(msgs, tools_for(toolsets, "weather", "recipes"), conversation_type="multi_step")
    assert not v.ok and any(why in p for p in v.problems()), v.problems()


def test_conversation_type_and_tool_count_rules(toolsets):
    tools = tools_for(toolsets, "weather", "recipes")
    v = conversation_problems(conv_multi_step(), tools, conversation_type="multi_turn")
    assert "needs 2 or more" in " ".join(v.problems())
    many = [t for ts in toolsets.values() for t in ts.tools]
    assert len(many) > 15
    v = conversation_problems(conv_multi_step(), many, conversation_type="multi_step")
    assert any("at most 15 allowed" in p for p in v.problems())
    no_tools = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert "no tool was called" in conversation_problems(no_tools, tools, conversation_type="single_turn").problems()


BOOKING = {"book_trip": {"name": "book_trip", "description": "Book a trip.", "parameters": {
    "type": "object", "required": ["traveller", "depart"],
    "properties": {
        "depart": {"type": "string", "format": "date"},
        "return_at": {"type": "string", "format": "date-time"},
        "traveller": {"type": "object", "required": ["name", "email"],
                      "properties": {"name": {"type": "string"}, "email": {"type": "string", "format": "email"},
                                     "address": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        "legs": {"type": "array", "items": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}}}},
        "site": {"type": "string", "format": "uri"},
    }}}}
TRAVELLER = {"name": "Ana", "email": "ana@example.org"}


@pytest.mark.parametrize("args,why", [
    ({"traveller": TRAVELLER, "depart": "2025-02-30"}, "is not a 'date'"),
    ({"traveller": TRAVELLER, "depart": "next tuesday"}, "is not a 'date'"),
    ({"traveller": TRAVELLER, "depart": "2025-03-04", "return_at": "2025-03-09 morning"}, "is not a 'date-time'"),
    ({"traveller": {"name": "Ana", "email": "ana at example"}, "depart": "2025-03-04"}, "is not a 'email'"),
    ({"traveller": TRAVELLER, "depart": "2025-03-04", "site": "not a uri"}, "is not a 'uri'"),
    ({"traveller": {**TRAVELLER, "seat": "12A"}, "depart": "2025-03-04"}, "traveller: Additional properties are not allowed ('seat'"),
    ({"traveller": {**TRAVELLER, "address": {"city": "Oslo", "zip": "0150"}}, "depart": "2025-03-04"},
     "traveller.address: Additional properties are not allowed ('zip'"),
    ({"traveller": TRAVELLER, "depart": "2025-03-04", "legs": [{"from": "OSL", "to": "LIS", "via": "CPH"}]},
     "legs.0: Additional properties are not allowed ('via'"),
])
def test_formats_and_nested_objects_are_validated(args, why):
    problems = tool_call_problems(call("book_trip", args), BOOKING)
    assert any(why in p for p in problems), problems


def test_a_well_formed_nested_call_passes_and_explicit_open_objects_stay_open():
    args = {"traveller": {**TRAVELLER, "address": {"city": "Oslo"}}, "depart": "2025-03-04",
            "return_at": "2025-03-09T08:00:00Z", "legs": [{"from": "OSL", "to": "LIS"}], "site": "https://example.org/trip"}
    assert tool_call_problems(call("book_trip", args), BOOKING) == []
    open_schema = {"book_trip": {**BOOKING["book_trip"], "parameters": {
        "type": "object", "properties": {"meta": {"type": "object", "additionalProperties": True}}}}}
    assert tool_call_problems(call("book_trip", {"meta": {"anything": 1}}), open_schema) == []
