"""Validators for tool-use conversations (Nemotron 3 Super §3.1.1, general tool use and
conversational tool use; spec §2.11-2.12; APIGen's format -> execution -> semantic checks).

Conversations are OpenAI chat messages: an assistant message may carry `tool_calls`
(`{"id", "type": "function", "function": {"name", "arguments": "<JSON text>"}}`), each answered
by a `{"role": "tool", "tool_call_id", "content"}` message. Tools are OpenAI tool definitions
(`{"type": "function", "function": {"name", "description", "parameters": <JSON schema>}}`).

- `tool_definition_problems`: a toolset is well formed (names, JSON Schema of the parameters).
- `tool_call_problems` (the paper's "Tool Verifier" plus rule checks): the function exists in the
  exposed subset, the arguments are a JSON object that validates against its schema with
  `jsonschema` (formats checked), no undeclared argument at any nesting level, no placeholder value copied from a prompt ("<id>", "string").
- `conversation_problems`: the message structure (every call answered once, in order, by a tool
  message; results are JSON; the conversation ends with an assistant answer) and what the
  conversation type promises (single-turn: one user message; multi-turn: several; multi-step:
  a call that depends on an earlier result within one user turn), at most 15 tools exposed.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError

MAX_TOOLS_PER_TASK = 15          # Nemotron 3 §3.1.1: "tool subset <= 15 tools"
CONVERSATION_TYPES = ("single_turn", "multi_turn", "multi_step")
# OpenAI's rule for function names
FUNCTION_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Values a weak model copies from the prompt or the schema instead of real arguments.
_PLACEHOLDER_RE = re.compile(r"^\s*(<[^<>]{1,60}>|\{\{?[^{}]{1,60}\}?\}|\[[A-Z_ ]{2,40}\]|\.\.\.|xxx+|todo|tbd|"
                             r"string|integer|number|boolean|your[_ ][a-z_ ]+|placeholder|example|n/?a)\s*$", re.IGNORECASE)


def tools_by_name(tools: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in tools}


# ---------------------------------------------------------------------------------------------
# Tool definitions
# ---------------------------------------------------------------------------------------------

def tool_definition_problems(tools: list[dict[str, Any]]) -> list[str]:
    """Every way `tools` is not a usable OpenAI toolset; empty when it is."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            problems.append(f"{where}: expected {{'type': 'function', 'function': {{...}}}}")
            continue
        fn = tool["function"]
        name = fn.get("name")
        where = f"tools[{i}] ({name})"
        if not isinstance(name, str) or not FUNCTION_NAME_RE.match(name):
            problems.append(f"{where}: name must match {FUNCTION_NAME_RE.pattern}")
        elif name in seen:
            problems.append(f"{where}: duplicate function name")
        else:
            seen.add(name)
        if not isinstance(fn.get("description"), str) or not fn["description"].strip():
            problems.append(f"{where}: missing description")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type") != "object":
            problems.append(f"{where}: parameters must be a JSON schema of type 'object'")
            continue
        try:
            Draft202012Validator.check_schema(params)
        except SchemaError as e:
            problems.append(f"{where}: parameters are not a valid JSON schema: {e.message}")
            continue
        props = params.get("properties", {})
        for req in params.get("required", []):
            if req not in props:
                problems.append(f"{where}: required parameter {req!r} is not among the properties")
    return problems


# ---------------------------------------------------------------------------------------------
# One tool call
# ---------------------------------------------------------------------------------------------

def _placeholders(value: Any, path: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(value, str):
        if _PLACEHOLDER_RE.match(value):
            out.append(f"argument {path or 'value'} is a placeholder ({value!r})")
    elif isinstance(value, dict):
        for k, v in value.items():
            out.extend(_placeholders(v, f"{path}.{k}" if path else k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_placeholders(v, f"{path}[{i}]"))
    return out


def parse_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """The decoded arguments of an OpenAI tool call; raises ValueError when they are not a JSON object."""
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(raw, dict):           # some servers return decoded arguments
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"arguments must be a JSON string, got {type(raw).__name__}")
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"arguments are not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(args, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def closed_schema(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that does not set it,
    nested ones included (properties, items, combinators, definitions), as OpenAI's strict mode reads it."""
    if isinstance(schema, list):
        return [closed_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (closed_schema(v) if k in ("items", "prefixItems", "anyOf", "oneOf", "allOf", "not", "if", "then", "else",
                                         "additionalProperties", "contains") else v) for k, v in schema.items()}
    for key in ("properties", "patternProperties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: closed_schema(sub) for name, sub in schema[key].items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def tool_call_problems(call: dict[str, Any], exposed: dict[str, dict[str, Any]], *,
                       allow_extra_arguments: bool = False, check_placeholders: bool = True) -> list[str]:
    """Problems of one tool call against the exposed functions (`tools_by_name` of the subset).

    Schema validation uses Draft 2020-12 (`jsonschema`) with formats checked (`FormatChecker`:
    date, date-time, email, uri, ...); `additionalProperties` is treated as false, at every level,
    unless the schema sets it (`closed_schema`), as OpenAI's strict mode does, because an argument
    the function does not declare is a hallucination.
    """
    if not isinstance(call, dict) or call.get("type", "function") != "function":
        return ["not a function tool call"]
    fn = call.get("function") or {}
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return ["tool call without a function name"]
    if name not in exposed:
        return [f"calls {name!r}, which is not among the exposed tools ({', '.join(sorted(exposed))})"]
    try:
        args = parse_arguments(call)
    except ValueError as e:
        return [f"{name}: {e}"]
    schema = exposed[name].get("parameters") or {"type": "object", "properties": {}}
    if not allow_extra_arguments:
        schema = closed_schema(schema)
    validator = Draft202012Validator(schema, format_checker=FormatChecker())
    problems = [f"{name}: {'.'.join(str(p) for p in err.absolute_path) or 'arguments'}: {err.message}"
                for err in sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))]
    for req in schema.get("required", []):
        if isinstance(args.get(req), str) and not args[req].strip():
            problems.append(f"{name}: required argument {req!r} is empty")
    if check_placeholders:
        problems += [f"{name}: {p}" for p in _placeholders(args)]
    return problems


# ---------------------------------------------------------------------------------------------
# A whole conversation
# ---------------------------------------------------------------------------------------------

@dataclass
class ConversationVerdict:
    """Structural and per-call problems of one conversation; `ok` iff there are none."""

    structure: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)     # {"id", "name", "problems": [...]}
    n_tool_calls: int = 0
    n_user_turns: int = 0
    n_steps: int = 0               # assistant messages with tool calls

    @property
    def schema_violations(self) -> int:
        return sum(len(c["problems"]) for c in self.calls)

    @property
    def ok(self) -> bool:
        return not self.structure and self.schema_violations == 0

    def problems(self) -> list[str]:
        return self.structure + [p for c in self.calls for p in c["problems"]]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ok=self.ok, schema_violations=self.schema_violations)
        return d


def conversation_problems(messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                          conversation_type: str | None = None, max_tools: int = MAX_TOOLS_PER_TASK,
                          max_calls_per_turn: int = 8, tool_results_json: bool = True,
                          allow_extra_arguments: bool = False, require_tool_call: bool = True) -> ConversationVerdict:
    """Check a full conversation in the OpenAI `tool_calls` format; see the module docstring."""
    v = ConversationVerdict()
    if len(tools) > max_tools:
        v.structure.append(f"{len(tools)} tools exposed, at most {max_tools} allowed")
    exposed = tools_by_name(tools)
    if conversation_type is not None and conversation_type not in CONVERSATION_TYPES:
        v.structure.append(f"unknown conversation type {conversation_type!r}")
    pending: dict[str, str] = {}      # call id -> function name, waiting for its tool message
    seen_ids: set[str] = set()
    answered_since_user = False       # a tool result has come back in the current user turn
    step_after_result = False         # a call was made after a result (multi-step)
    roles = [m.get("role") for m in messages]
    body = [m for m in messages if m.get("role") != "system"]
    if not body or body[0].get("role") != "user":
        v.structure.append("the conversation must start with a user message (after an optional system message)")
    if any(r == "system" for r in roles[1:]):
        v.structure.append("a system message may only come first")
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            v.structure.append(f"messages[{i}]: unknown role {role!r}")
            continue
        if role in ("user", "assistant") and pending:
            v.structure.append(f"messages[{i}]: {role} message before the results of calls {sorted(pending)}")
            pending.clear()
        if role == "user":
            v.n_user_turns += 1
            answered_since_user = False
            if not str(m.get("content") or "").strip():
                v.structure.append(f"messages[{i}]: empty user message")
        elif role == "assistant":
            calls = m.get("tool_calls") or []
            if not calls:
                if not str(m.get("content") or "").strip():
                    v.structure.append(f"messages[{i}]: assistant message with neither content nor tool calls")
                continue
            v.n_steps += 1
            if answered_since_user:
                step_after_result = True
            if len(calls) > max_calls_per_turn:
                v.structure.append(f"messages[{i}]: {len(calls)} tool calls in one message, at most {max_calls_per_turn}")
            checked = _message_calls(calls, exposed, seen_ids, pending, allow_extra_arguments)
            v.calls += checked
            v.n_tool_calls += len(checked)
        elif role == "tool":
            cid = m.get("tool_call_id")
            if cid not in pending:
                v.structure.append(f"messages[{i}]: tool result for {cid!r}, which no pending call has")
                continue
            pending.pop(cid)
            answered_since_user = True
            if tool_results_json:
                try:
                    json.loads(m.get("content") or "")
                except (json.JSONDecodeError, TypeError):
                    v.structure.append(f"messages[{i}]: tool result for {cid!r} is not JSON")
    if pending:
        v.structure.append(f"calls {sorted(pending)} never got a result")
    v.structure += _ending_problems(body, v, conversation_type, step_after_result, require_tool_call)
    return v


def _message_calls(calls: list[Any], exposed: dict[str, dict[str, Any]], seen_ids: set[str], pending: dict[str, str],
                   allow_extra_arguments: bool) -> list[dict[str, Any]]:
    """The calls of one assistant message, each with its problems (against the exposed tools, a
    missing or repeated id, the same call twice in the message); a call with a new id joins
    `seen_ids` and waits in `pending` (id -> function name) for its tool message."""
    checked = []
    signatures: set[str] = set()
    for call in calls:
        cid = call.get("id") if isinstance(call, dict) else None
        name = ((call.get("function") or {}).get("name") if isinstance(call, dict) else None) or "?"
        problems = tool_call_problems(call, exposed, allow_extra_arguments=allow_extra_arguments)
        if not isinstance(cid, str) or not cid:
            problems.append(f"{name}: tool call without an id")
        elif cid in seen_ids:
            problems.append(f"{name}: duplicate tool call id {cid!r}")
        else:
            seen_ids.add(cid)
            pending[cid] = name
        sig = json.dumps([name, (call.get("function") or {}).get("arguments")], sort_keys=True, default=str)
        if sig in signatures:
            problems.append(f"{name}: the same call twice in one message")
        signatures.add(sig)
        checked.append({"id": cid, "name": name, "problems": problems})
    return checked


def _ending_problems(body: list[dict[str, Any]], v: ConversationVerdict, conversation_type: str | None,
                     step_after_result: bool, require_tool_call: bool) -> list[str]:
    """What the whole conversation (`body`: its messages after the system one) must be: it ends with
    an assistant answer, has the user turns and steps its type names, and calls a tool."""
    problems = []
    last = body[-1] if body else {}
    if last.get("role") != "assistant" or last.get("tool_calls") or not str(last.get("content") or "").strip():
        problems.append("the conversation must end with an assistant answer (content, no tool calls)")
    if conversation_type == "single_turn" and v.n_user_turns != 1:
        problems.append(f"single_turn conversation has {v.n_user_turns} user messages")
    if conversation_type == "multi_turn" and v.n_user_turns < 2:
        problems.append(f"multi_turn conversation has {v.n_user_turns} user message(s), needs 2 or more")
    if conversation_type == "multi_step" and not step_after_result:
        problems.append("multi_step conversation has no tool call that follows an earlier tool result")
    if require_tool_call and v.n_tool_calls == 0:
        problems.append("no tool was called")
    return problems
