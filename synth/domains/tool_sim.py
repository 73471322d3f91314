"""Multi-agent simulation of tool-use conversations (Nemotron 3 Super §3.1.1, Fig. 14-15):
an Assistant model that calls tools, a Tool model ("API response simulator") that answers the
calls, a User model that continues the conversation, and an inline turn-level judge.

The assistant's tool calls travel by one of two protocols (`SimOptions.protocol`):
- `native`: OpenAI tool calling. The request carries `tools` and `tool_choice: "auto"`, the
  conversation so far as OpenAI messages (assistant `tool_calls`, `role: tool` results), and the
  server answers with `tool_calls` (vLLM with `--enable-auto-tool-choice --tool-call-parser`,
  SGLang, hosted APIs). Call text the server left unparsed in the content (vLLM's hermes parser
  gives up on the whole reply when one block is malformed) is parsed as in the prompted path, so a
  malformed call reads as the same Tool Verifier problem either way.
- `prompted`: the Hermes/Qwen layout in the prompt, for endpoints or models without tool support:
  the tools are listed inside `<tools>...</tools>` in the assistant's system prompt and the model
  answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; results go back
  as `<tool_response>` messages. Works with any endpoint and any chat template.
Both store the conversation in the OpenAI `tool_calls` message format, with call ids numbered
per conversation (`call_1`, ...) and arguments as canonical JSON text, so the same model text
gives the same record by either path. Every call is checked by the Tool Verifier
(`tool_validate.tool_call_problems`: the function exists, the arguments validate against its JSON
schema, rule checks) before the Tool model sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from synth.domains.tool_validate import parse_arguments, tool_call_problems, tools_by_name
from synth.toolcalls import canonical_arguments, hermes_blocks, parse_json_object, render_hermes_call

PROTOCOLS = ("native", "prompted")


class ToolCallFailed(RuntimeError):
    """A real tool (an MCP server's) failed, timed out or returned an error: the conversation is
    rejected with this reason."""

ASSISTANT_SYSTEM = """{preamble}

You can call these functions:
<tools>
{tools}
</tools>

To call a function, write one block per call:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>
The results come back in a message that starts with <tool_response>. Call functions only when you need them; when you have what you need, answer the user in plain text without any <tool_call> block."""


def render_tools(tools: list[dict[str, Any]]) -> str:
    """One JSON line per tool definition (what goes inside `<tools>`)."""
    return "\n".join(json.dumps(t, sort_keys=True, ensure_ascii=False) for t in tools)


@dataclass
class AssistantTurn:
    content: str | None
    calls: list[dict[str, Any]]            # OpenAI tool calls (arguments as JSON text)
    problems: list[str] = field(default_factory=list)   # unparsable call blocks


def parse_assistant_turn(text: str, call_ids: Callable[[], str]) -> AssistantTurn:
    """Split a prompted assistant reply into its text and OpenAI-format tool calls."""
    found = hermes_blocks(text)
    calls = [{"id": call_ids(), "type": "function", "function": c} for c in found.calls]
    return AssistantTurn(found.content, calls, found.problems)


def native_assistant_turn(content: str | None, tool_calls: list[dict[str, Any]] | None,
                          call_ids: Callable[[], str]) -> AssistantTurn:
    """An answer of native tool calling as the same `AssistantTurn` the prompted path gives: the
    server's calls renumbered per conversation with canonical arguments, then whatever call text
    the server left in the content, parsed as a prompted reply is."""
    calls = [{"id": call_ids(), "type": "function",
              "function": {"name": c["function"]["name"], "arguments": canonical_arguments(c["function"]["arguments"])}}
             for c in tool_calls or []]
    rest = parse_assistant_turn(content or "", call_ids)
    return AssistantTurn(rest.content, calls + rest.calls, rest.problems)


def to_native_messages(system: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as an OpenAI tool-calling request carries it (system first)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in messages:
        if m["role"] == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
            if m.get("tool_calls"):
                msg["tool_calls"] = [{"id": c["id"], "type": "function", "function": dict(c["function"])}
                                     for c in m["tool_calls"]]
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def to_prompt_messages(system: str, messages: list[dict[str, Any]], tool_result_role: str = "user") -> list[dict[str, Any]]:
    """The OpenAI-format conversation as the prompted assistant model sees it: calls rendered as
    `<tool_call>` blocks, results as `<tool_response>` messages (role `user` by default, which every
    chat template accepts)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in messages:
        if m["role"] == "assistant":
            parts = [m.get("content") or ""]
            for c in m.get("tool_calls") or []:
                try:
                    args: Any = parse_arguments(c)
                except ValueError:            # kept as written when it is not a JSON object
                    args = json.dumps(c["function"].get("arguments"))
                parts.append(render_hermes_call(c["function"]["name"], args))
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif m["role"] == "tool":
            text = f"<tool_response>\n{m['content']}\n</tool_response>"
            if tool_result_role == "user" and out[-1]["role"] == "user":
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + text}
            else:
                out.append({"role": tool_result_role, "content": text})
        elif m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
    return out


def transcript(messages: list[dict[str, Any]], max_chars: int = 6000) -> str:
    """The conversation as plain text for the user model and the judges."""
    lines = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "; ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in m["tool_calls"])
            lines.append(f"ASSISTANT: {m.get('content') or ''} [calls: {calls}]".replace(":  [", ": ["))
        elif m["role"] == "tool":
            lines.append(f"TOOL RESULT: {m['content']}")
        elif m["role"] in ("user", "assistant"):
            lines.append(f"{m['role'].upper()}: {m.get('content') or ''}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "...\n" + text[-max_chars:]


# ---- the simulation loop ------------------------------------------------------------------------

Ask = Callable[[str, list[dict[str, Any]], tuple], Awaitable[str]]


@dataclass
class SimOptions:
    max_steps_per_turn: int = 4           # assistant messages (with calls) before a final answer
    user_turns: int = 1                   # user messages in all (multi-turn: 2 or more)
    tool_result_role: str = "user"        # prompted protocol: the role that carries <tool_response> blocks
    turn_judge: bool = True
    stop_on_violation: bool = True
    protocol: str = "prompted"            # native | prompted (see the module docstring)


@dataclass
class SimResult:
    messages: list[dict[str, Any]]
    ok: bool
    reason: str = ""
    turn_judgements: list[dict[str, Any]] = field(default_factory=list)
    schema_violations: list[str] = field(default_factory=list)
    stage_counts: dict[str, list[int]] = field(default_factory=dict)

    def count(self, stage: str, n_in: int, n_out: int) -> None:
        c = self.stage_counts.setdefault(stage, [0, 0])
        c[0] += n_in
        c[1] += n_out


async def simulate(*, tools: list[dict[str, Any]], system: str, first_user: str, opts: SimOptions,
                   assistant: Callable[[list[dict[str, Any]], tuple], Awaitable[Any]],
                   tool_model: Callable[[dict[str, Any], list[dict[str, Any]], tuple], Awaitable[str]],
                   user_model: Callable[[list[dict[str, Any]], int, tuple], Awaitable[str | None]] | None = None,
                   turn_judge: Callable[[list[dict[str, Any]], dict[str, Any], tuple], Awaitable[tuple[bool | None, str]]] | None = None,
                   ) -> SimResult:
    """Run one conversation. The callables wrap teacher requests (their last argument is a key
    that makes each request's seed unique); `user_model` returns the next user message or None
    when the user is done. `assistant` gets the request messages of `opts.protocol` (prompted:
    the Hermes layout with `system` listing the tools; native: OpenAI messages, `system` without
    them) and returns the reply text (prompted) or `(content, tool_calls)` (native). Stops at the
    first failed check (tool verifier, tool response, turn judge) with the reason."""
    if opts.protocol not in PROTOCOLS:
        raise ValueError(f"unknown tool protocol {opts.protocol!r} ({' | '.join(PROTOCOLS)})")
    exposed = tools_by_name(tools)
    messages: list[dict[str, Any]] = [{"role": "user", "content": first_user}]
    res = SimResult(messages, ok=False)
    n_ids = 0

    def next_id() -> str:
        nonlocal n_ids
        n_ids += 1
        return f"call_{n_ids}"

    for turn in range(opts.user_turns):
        answered = False
        for step in range(opts.max_steps_per_turn):
            key = (turn, step)
            parsed = await _assistant_turn(assistant, system, messages, opts, key, next_id)
            msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.calls:
                msg["tool_calls"] = parsed.calls
            problems = _verify_calls(parsed, exposed, res)
            if problems:
                res.schema_violations += problems
                if opts.stop_on_violation:
                    messages.append(msg)
                    res.reason = "tool verifier: " + "; ".join(problems[:3])
                    return res
            if not parsed.calls and not (parsed.content or "").strip():
                res.reason = "empty assistant reply"
                return res
            messages.append(msg)
            if opts.turn_judge and turn_judge is not None:
                verdict, why = await turn_judge(messages[:-1], msg, key)
                res.turn_judgements.append({"turn": turn, "step": step, "pass": bool(verdict), "reason": why})
                res.count("turn_judge", 1, 1 if verdict else 0)
                if not verdict:
                    res.reason = f"turn judge: {why or 'FAIL'}"
                    return res
            if not parsed.calls:
                answered = True
                break
            res.reason = await _answer_calls(parsed.calls, messages, tool_model, key, res)
            if res.reason:
                return res
        if not answered:
            res.reason = f"no final answer after {opts.max_steps_per_turn} assistant steps"
            return res
        if turn + 1 < opts.user_turns:
            if user_model is None:
                break
            nxt = await user_model(messages, turn + 1, (turn + 1,))
            if nxt is None:
                break
            messages.append({"role": "user", "content": nxt})
    res.ok = True
    return res


async def _assistant_turn(assistant: Callable[[list[dict[str, Any]], tuple], Awaitable[Any]], system: str,
                          messages: list[dict[str, Any]], opts: SimOptions, key: tuple,
                          next_id: Callable[[], str]) -> AssistantTurn:
    """The assistant's next message, requested and parsed in `opts.protocol`'s layout."""
    if opts.protocol == "native":
        content, calls = await assistant(to_native_messages(system, messages), key)
        return native_assistant_turn(content, calls, next_id)
    reply = await assistant(to_prompt_messages(system, messages, opts.tool_result_role), key)
    return parse_assistant_turn(reply, next_id)


def _verify_calls(parsed: AssistantTurn, exposed: dict[str, Any], res: SimResult) -> list[str]:
    """The Tool Verifier: the turn's problems (call blocks that do not parse, calls that do not fit
    the exposed tools). Its acceptance is counted per call (an unparsable call block counts as one)."""
    problems = list(parsed.problems)
    n_valid = 0
    for call in parsed.calls:
        found = tool_call_problems(call, exposed)
        problems += found
        n_valid += not found
    if parsed.calls or parsed.problems:
        res.count("tool_verifier", len(parsed.calls) + len(parsed.problems), n_valid)
    return problems


async def _answer_calls(calls: list[dict[str, Any]], messages: list[dict[str, Any]],
                        tool_model: Callable[[dict[str, Any], list[dict[str, Any]], tuple], Awaitable[str]],
                        key: tuple, res: SimResult) -> str:
    """Append the tool simulator's response to each call, in order; the reason of the first one
    that fails (the tool refused, or its reply is not a JSON object), or "" when all answered."""
    for i, call in enumerate(calls):
        try:
            raw = await tool_model(call, messages, (*key, i))
        except ToolCallFailed as e:
            res.count("tool_response", 1, 0)
            return str(e)
        try:
            result = parse_json_object(raw)
        except ValueError as e:
            res.count("tool_response", 1, 0)
            return f"tool simulator for {call['function']['name']}: {e}"
        res.count("tool_response", 1, 1)
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})
    return ""


def call_arguments(call: dict[str, Any]) -> dict[str, Any]:
    try:
        return parse_arguments(call)
    except ValueError:
        return {}


def expected_actions_met(messages: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[str]:
    """Which expected actions ({name, arguments subset}) no tool call of the conversation made."""
    made = [c for m in messages if m["role"] == "assistant" for c in (m.get("tool_calls") or [])]
    missing = []
    for act in expected:
        want = act.get("arguments") or {}
        if not any(c["function"]["name"] == act.get("name")
                   and all(call_arguments(c).get(k) == v for k, v in want.items()) for c in made):
            missing.append(f"{act.get('name')}({json.dumps(want, sort_keys=True)})")
    return missing
