"""Typed reads of a benchmark record's fields in its public layout: what a preset relies on is
checked where it is read, so a record that does not fit is refused naming the field
(`RecordError`; `tasks.to_documents` adds the file and the record) instead of crashing later or,
worse, being scored as something it is not.

- `text`: a string with a non-blank character, encodable as UTF-8 (a lone surrogate such as a
  `\\ud800` escape is refused: no tokenizer can take it);
- `text_list`: a JSON list (a string is not a list of its characters) of at least `at_least`
  texts (numbers are taken as their text, as the layouts' numeric choices are);
- `index`: an integer (or digit string where the layout writes one) inside `range(n)`; a boolean
  is not an index;
- `label`: one of the layout's own labels (ARC's "A".."D" or "1".."4": "0" is neither).
"""

from __future__ import annotations

from typing import Any


class RecordError(ValueError):
    """A record that does not fit its layout: the field and what is wrong with it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), f"a {type(value).__name__}")


def field(rec: dict[str, Any], key: str) -> Any:
    if key not in rec:
        raise RecordError(key, f"missing (the record has {sorted(rec)[:12]})")
    return rec[key]


def check_text(key: str, value: str) -> str:
    """`value` as a text field: a non-blank character, encodable as UTF-8."""
    if not value.strip():
        raise RecordError(key, "is empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(key, f"holds a lone surrogate {value[e.start]!r} at character {e.start}, "
                          "not text") from None
    return value


def text(rec: dict[str, Any], key: str) -> str:
    value = field(rec, key)
    if not isinstance(value, str):
        raise RecordError(key, f"expected text, found {kind_of(value)}")
    return check_text(key, value)


def text_or_number(rec: dict[str, Any], key: str) -> str:
    """A text field that the layout may also write as a number (CMMLU's options, MATH's answer)."""
    return _as_text(key, field(rec, key))


def _as_text(key: str, value: Any) -> str:
    if isinstance(value, str):
        return check_text(key, value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise RecordError(key, f"expected text, found {kind_of(value)}")


def text_list(rec: dict[str, Any], key: str, at_least: int = 2, value: Any = ...) -> list[str]:
    """A list of texts (`value` when given: a nested field read by the caller, named `key`)."""
    value = field(rec, key) if value is ... else value
    if not isinstance(value, list):
        raise RecordError(key, f"expected a list, found {kind_of(value)}")
    if len(value) < at_least:
        raise RecordError(key, f"has {len(value)} entries, at least {at_least} needed")
    return [_as_text(f"{key}[{i}]", v) for i, v in enumerate(value)]


def index(rec: dict[str, Any], key: str, n: int, base: int = 0, digit_string: bool = False) -> int:
    """A 0-based index from an integer (or a digit string, where the layout writes one) counted
    from `base`, inside `range(n)`."""
    value = field(rec, key)
    if isinstance(value, str) and digit_string and value.strip().isdigit():
        raw = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        raw = value
    else:
        form = "an integer or a digit string" if digit_string else "an integer"
        raise RecordError(key, f"expected {form}, found {kind_of(value)} {value!r:.40}")
    if not 0 <= raw - base < n:
        raise RecordError(key, f"{raw} is outside {base}..{n - 1 + base} ({n} choices)")
    return raw - base


def label(rec: dict[str, Any], key: str, labels: list[str]) -> int:
    """The index of `rec[key]` among the layout's own labels."""
    value = field(rec, key)
    if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value).strip() not in labels:
        raise RecordError(key, f"{value!r:.40} is not one of the labels {labels}")
    return labels.index(str(value).strip())
