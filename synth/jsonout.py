"""Structured-output replies checked against their JSON schema (`generate.json_schema`): a
server that ignores `response_format` (or a model that escapes it) must not turn "Sure! The
answer is 7." into a record.

Minimal stand-in for `synth.verify.check_json_schema` (the verifier module's, with formats and
nested objects); the steps call that one when it exists.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker


def check_json_schema(text: str, schema: dict[str, Any]) -> str | None:
    """None when `text` is one JSON value valid under `schema` (Draft 2020-12, formats checked),
    else why not (the first error, with its path)."""
    s = text.strip()
    if s.startswith("```"):
        s = s.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        return f"reply is not JSON ({e.msg} at char {e.pos}): {text.strip()[:80]!r}"
    errors = sorted(Draft202012Validator(schema, format_checker=FormatChecker()).iter_errors(value),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        return f"reply does not match the JSON schema at {where}: {e.message[:160]}"
    return None
