"""Multi-agent simulation of tool-use conversations (Nemotron 3 Super §3.1.1, Fig. 14-15):
an Assistant model that calls tools, a Tool model ("API response simulator") that answers the
calls, a User model that continues the conversation, and an inline turn-level judge.

Tool calls travel in the prompt, in the Hermes/Qwen layout that vLLM's tool parsers also read:
the tools are listed inside `<tools>...</tools>` in the assistant's system prompt and the model
answers with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks. That works with
any OpenAI-compatible endpoint and any chat template (including models without native tool
calling); the conversation is stored in the OpenAI `tool_calls` message format regardless.
Every call is checked by the Tool Verifier (`tool_validate.tool_call_problems`: the function
exists, the arguments validate against its JSON schema, rule checks) before the Tool model sees it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from synth.domains.tool_validate import parse_arguments, tool_call_problems, tools_by_name

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")

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


def parse_json_object(text: str) -> dict[str, Any]:
    """A JSON object from a model's reply (a fenced block, or the first {...} span). ValueError otherwise."""
    s = _FENCE_RE.sub("", text.strip()).strip()
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        start, end = s.find("{"), s.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("no JSON object in the reply") from None
        try:
            obj = json.loads(s[start:end + 1])
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj


@dataclass
class AssistantTurn:
    content: str | None
    calls: list[dict[str, Any]]            # OpenAI tool calls (arguments as JSON text)
    problems: list[str] = field(default_factory=list)   # unparsable call blocks


def parse_assistant_turn(text: str, call_ids: Callable[[], str]) -> AssistantTurn:
    """Split a prompted assistant reply into its text and OpenAI-format tool calls."""
    blocks = _TOOL_CALL_RE.findall(text)
    content = _TOOL_CALL_RE.sub("", text).strip() or None
    calls: list[dict[str, Any]] = []
    problems: list[str] = []
    for raw in blocks:
        try:
            obj = parse_json_object(raw)
        except ValueError as e:
            problems.append(f"tool call block is not a JSON object: {e}")
            continue
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(name, str) or not name:
            problems.append("tool call block without a function name")
            continue
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, sort_keys=True)
        calls.append({"id": call_ids(), "type": "function", "function": {"name": name, "arguments": arguments}})
    return AssistantTurn(content, calls, problems)


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
                    args = c["function"].get("arguments")
                parts.append("<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": args},
                                                          ensure_ascii=False) + "\n</tool_call>")
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
    tool_result_role: str = "user"
    turn_judge: bool = True
    stop_on_violation: bool = True


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
                   assistant: Callable[[list[dict[str, Any]], tuple], Awaitable[str]],
                   tool_model: Callable[[dict[str, Any], list[dict[str, Any]], tuple], Awaitable[str]],
                   user_model: Callable[[list[dict[str, Any]], int, tuple], Awaitable[str | None]] | None = None,
                   turn_judge: Callable[[list[dict[str, Any]], dict[str, Any], tuple], Awaitable[tuple[bool | None, str]]] | None = None,
                   ) -> SimResult:
    """Run one conversation. The callables wrap teacher requests (their last argument is a key
    that makes each request's seed unique); `user_model` returns the next user message or None
    when the user is done. Stops at the first failed check (tool verifier, tool response, turn
    judge) with the reason."""
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
            reply = await assistant(to_prompt_messages(system, messages, opts.tool_result_role), key)
            parsed = parse_assistant_turn(reply, next_id)
            msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
            if parsed.calls:
                msg["tool_calls"] = parsed.calls
            problems = list(parsed.problems)
            n_valid = 0
            for call in parsed.calls:
                found = tool_call_problems(call, exposed)
                problems += found
                n_valid += not found
            # the Tool Verifier's acceptance is per call (an unparsable call block counts as one)
            if parsed.calls or parsed.problems:
                res.count("tool_verifier", len(parsed.calls) + len(parsed.problems), n_valid)
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
            for i, call in enumerate(parsed.calls):
                raw = await tool_model(call, messages, (turn, step, i))
                try:
                    result = parse_json_object(raw)
                    res.count("tool_response", 1, 1)
                except ValueError as e:
                    res.count("tool_response", 1, 0)
                    res.reason = f"tool simulator for {call['function']['name']}: {e}"
                    return res
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": json.dumps(result, ensure_ascii=False, sort_keys=True)})
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
