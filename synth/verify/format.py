"""Formats a response must have: the reasoning toggle (Llama-Nemotron §3.2, §5.1 format reward; LN
testable behaviour 23: on-mode needs exactly one `<think>`...`</think>` pair, in order, with a
non-empty final answer after it; off-mode needs neither tag), what counts as the answer after the
thinking, and structured output valid under a JSON schema (Draft 2020-12 with formats)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import SchemaError

# ---- reasoning toggle format ------------------------------------------------------------------

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ReasoningParse:
    think: str | None       # the text inside the one think block (None when absent or malformed)
    answer: str             # what follows </think> (on-mode) or the whole response (off-mode)
    ok: bool
    problem: str            # why not ok ("" when ok)


def parse_reasoning(text: str, mode: str) -> ReasoningParse:
    """Split and check a response for the `detailed thinking on|off` toggle."""
    n_open, n_close = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    if mode == "off":
        if n_open or n_close:
            return ReasoningParse(None, text.strip(), False, "off-mode response contains think tags")
        if not text.strip():
            return ReasoningParse(None, "", False, "empty response")
        return ReasoningParse(None, text.strip(), True, "")
    if mode != "on":
        raise ValueError(f"mode must be 'on' or 'off', not {mode!r}")
    if n_open != 1 or n_close != 1:
        what = "missing" if (n_open == 0 or n_close == 0) else "repeated or nested"
        return ReasoningParse(None, text.strip(), False,
                              f"on-mode needs exactly one <think>...</think> block ({what}: {n_open} open, {n_close} close)")
    i, j = text.index(THINK_OPEN), text.index(THINK_CLOSE)
    if j < i:
        return ReasoningParse(None, text.strip(), False, "</think> comes before <think>")
    if text[:i].strip():
        return ReasoningParse(None, text.strip(), False, "text before <think>")
    think = text[i + len(THINK_OPEN): j].strip()
    answer = text[j + len(THINK_CLOSE):].strip()
    if not think:
        return ReasoningParse(None, answer, False, "empty think block")
    if not answer:
        return ReasoningParse(think, "", False, "no final answer after </think>")
    return ReasoningParse(think, answer, True, "")


def after_thinking(text: str) -> str:
    """What a response says after its thinking: the text after the last `</think>`; "" when a
    `<think>` is never closed (all of it is thinking); the whole text when it has no think tags.
    Answers guessed inside a think block are never the final answer."""
    if THINK_CLOSE in text:
        return text[text.rindex(THINK_CLOSE) + len(THINK_CLOSE):]
    return "" if THINK_OPEN in text else text


# ---- structured output ----------------------------------------------------------------------------

def check_json_schema(text: str, schema: dict[str, Any]) -> str | None:
    """None when `text` (optionally in a ```json fence) is one JSON value valid under `schema`
    (Draft 2020-12, formats checked with `FormatChecker`), else why not: the first error and its path."""
    s = text.strip()
    fence = re.fullmatch(r"```[a-zA-Z]*\s*\n?(.*?)\n?```", s, re.S)
    if fence:
        s = fence.group(1).strip()
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        return f"reply is not JSON ({e.msg} at char {e.pos}): {text.strip()[:80]!r}"
    try:
        validator = Draft202012Validator(schema, format_checker=FormatChecker())
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except SchemaError as e:
        return f"the JSON schema itself is invalid: {e.message[:160]}"
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        return f"reply does not match the JSON schema at {where}: {e.message[:160]}"
    return None
