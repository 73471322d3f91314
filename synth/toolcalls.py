"""OpenAI tool calls: the protocol's shapes and the Hermes/Qwen text layout they travel in.

On the wire (OpenAI chat completions) a request carries `tools` (`[{"type": "function",
"function": {"name", "description", "parameters": <JSON schema>}}]`) and `tool_choice`
(`"auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}`); an answer's
message carries `tool_calls` (`[{"id", "type": "function", "function": {"name", "arguments":
"<JSON text>"}}]`) and `finish_reason == "tool_calls"`; the conversation goes on with that
assistant message and one `{"role": "tool", "tool_call_id", "content"}` message per call.

Inside the model, Hermes-style chat templates (Qwen2.5/Qwen3, Hermes 2 Pro; vLLM's `hermes`
tool parser reads them) list the tools in the system prompt between `<tools>` and `</tools>`
and the model writes `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks.
This module holds both sides, with no engine dependency:

- `normalize_tool_calls`: the `tool_calls` of a response, checked for the protocol's shape.
- `hermes_server_parse`: what vLLM's `hermes` parser makes of a completion (used by the scripted
  server and the in-process vLLM backend, so they answer as `vllm serve` does).
- `hermes_blocks`: a lenient per-block parse (what the prompted tool-use path and a client that
  finds unparsed call text in a native answer need): each block either becomes a call or a
  problem, and the text around the blocks is the content.
- `render_hermes_call`, `canonical_arguments`: one call as text, arguments as canonical JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
# a closed block, or an unclosed one running to the end of the text (vLLM's hermes regex)
_BLOCK_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


class ToolCallShapeError(ValueError):
    """A response's `tool_calls` do not have the protocol's shape (a server bug, not the model's)."""


def canonical_arguments(args: Any) -> str:
    """Arguments as the JSON text records carry: a decoded object is dumped with sorted keys
    (so the same call reads the same whichever path produced it); text is kept verbatim, valid
    or not (the Tool Verifier judges it)."""
    if isinstance(args, str):
        try:
            obj = json.loads(args)
        except json.JSONDecodeError:
            return args
        return json.dumps(obj, ensure_ascii=False, sort_keys=True) if isinstance(obj, dict) else args
    return json.dumps(args, ensure_ascii=False, sort_keys=True)


def normalize_tool_calls(raw: Any) -> list[dict[str, Any]] | None:
    """The `tool_calls` of a chat-completion message in the protocol's shape, or None when there
    are none. Arguments a server returns decoded (an object) are encoded as JSON text; a call
    without an id gets `call_<i>` (its position). Raises `ToolCallShapeError` when the field is
    not a list of function calls with a name."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise ToolCallShapeError(f"tool_calls is a {type(raw).__name__}, not a list")
    out = []
    for i, tc in enumerate(raw):
        if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict):
            raise ToolCallShapeError(f"tool_calls[{i}] has no function object: {str(tc)[:120]}")
        fn = tc["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolCallShapeError(f"tool_calls[{i}] has no function name: {str(tc)[:120]}")
        if tc.get("type", "function") != "function":
            raise ToolCallShapeError(f"tool_calls[{i}] has type {tc.get('type')!r}, not 'function'")
        args = fn.get("arguments", "")
        if args is None:
            args = ""
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        cid = tc.get("id")
        out.append({"id": str(cid) if cid else f"call_{i}", "type": "function",
                    "function": {"name": name, "arguments": args}})
    return out


def render_hermes_call(name: str, arguments: Any) -> str:
    """One call in the Hermes/Qwen layout; arguments given as text are written verbatim (as
    Qwen3's template does), decoded ones as JSON."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}\n{TOOL_CALL_CLOSE}'


def hermes_server_parse(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, calls) as vLLM's `hermes` tool parser returns them: no `<tool_call>` -> the text
    is the content; otherwise every block must be JSON with a name, and the content is the text
    before the first block; if any block fails, nothing is a call and the whole text is content."""
    if TOOL_CALL_OPEN not in text:
        return text, []
    calls = []
    try:
        for body in _BLOCK_RE.findall(text):
            obj = json.loads(body)
            calls.append({"name": obj["name"], "arguments": json.dumps(obj.get("arguments", {}), ensure_ascii=False)})
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return text, []
    prefix = text[: text.find(TOOL_CALL_OPEN)]
    return (prefix or None), calls


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
class HermesBlocks:
    content: str | None                    # the text with every block removed (None when empty)
    calls: list[dict[str, Any]]            # {"name", "arguments": canonical JSON text}
    problems: list[str] = field(default_factory=list)   # one per block that is not a call


def hermes_blocks(text: str) -> HermesBlocks:
    """Every `<tool_call>` block of `text` as a call or a problem (lenient: a fenced block or one
    with `parameters` instead of `arguments` still counts)."""
    blocks = _BLOCK_RE.findall(text)
    content = _BLOCK_RE.sub("", text).strip() or None
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
        calls.append({"name": name, "arguments": canonical_arguments(args)})
    return HermesBlocks(content, calls, problems)
