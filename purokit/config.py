"""Typed YAML configs with command-line overrides (`key.sub=value`), layered as
defaults < file < overrides. Each command owns one pydantic model for its config."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from purokit.errors import ContractError, OverrideError

C = TypeVar("C", bound=BaseModel)


class StrictModel(BaseModel):
    """The one strict base for configs and contracts: unknown fields are errors, not ignored
    (a misspelt `dedup.treshold` must fail, not silently keep the default)."""

    model_config = ConfigDict(extra="forbid")


def field_path(loc: tuple[Any, ...]) -> str:
    """Pydantic's error location as one dotted path: `components.1.score` (list indexes as parts)."""
    return ".".join(str(p) for p in loc)


def validate(model: type[C], data: Any, path: str | os.PathLike | None = None) -> C:
    """`model.model_validate(data)`, with a `ValidationError` turned into a `ContractError` that
    names the file and the first failing field in one format (`a.1.b`)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise contract_error(e, path) from None


def repeated(values: Iterable[Any]) -> list[Any]:
    """The values that occur more than once, sorted: what a "must be unique" check names."""
    counts = Counter(values)
    return sorted(v for v, n in counts.items() if n > 1)


def contract_error(e: ValidationError, path: str | os.PathLike | None) -> ContractError:
    """The `ContractError` for a pydantic `ValidationError`: first error, its field and input."""
    err = e.errors()[0]
    return ContractError(path or "<overrides>", f"{err['msg']} (input: {err.get('input')!r:.80})",
                         field=field_path(err["loc"]))


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=3` -> (['a', 'b'], 3). The value is parsed as YAML, so numbers, bools and lists work."""
    if "=" not in item:
        raise OverrideError(f"override {item!r} is not of the form key.sub=value")
    key, value = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(value)


def _child(node: Any, key: str, item: str, create: bool) -> Any:
    if isinstance(node, list):
        try:
            return node[int(key)]
        except (ValueError, IndexError):
            raise OverrideError(f"override {item!r}: '{key}' is not an index of a list of {len(node)}") from None
    if not isinstance(node, dict):
        raise OverrideError(f"override {item!r}: cannot descend into '{key}' (not a mapping or list)")
    if create:
        return node.setdefault(key, {})
    return node[key]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=v` overrides in place; integer keys index lists (`steps.3.n=8`)."""
    for item in overrides:
        keys, value = parse_override(item)
        node: Any = data
        for k in keys[:-1]:
            node = _child(node, k, item, create=True)
        last = keys[-1]
        if isinstance(node, list):
            try:
                node[int(last)] = value
            except (ValueError, IndexError):
                raise OverrideError(f"override {item!r}: '{last}' is not an index of a list of {len(node)}") from None
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise OverrideError(f"override {item!r}: cannot set '{last}' (not a mapping or list)")
    return data


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first_line: int, second_line: int):
        super().__init__(f"duplicate key {key!r} at lines {first_line} and {second_line} "
                         f"(YAML keeps only the last; remove one)")
        self.key, self.first_line, self.second_line = key, first_line, second_line


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping (plain YAML keeps the last
    silently, so a repeated `bucket_count:` would override the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
            except TypeError:          # an unhashable key: SafeLoader reports it itself
                break
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def deep_merge(base: dict, over: dict) -> dict:
    """Merge `over` into `base` (a layer of a config over the one below); a mapping whose `kind`
    changes (a schedule, a retention rule) is replaced, not merged."""
    out = dict(base)
    for k, v in over.items():
        b = out.get(k)
        if isinstance(v, dict) and isinstance(b, dict) and v.get("kind", b.get("kind")) == b.get("kind"):
            out[k] = deep_merge(b, v)
        else:
            out[k] = v
    return out


def iter_jsonl(lines: Iterable[str], path: str | os.PathLike,
               where: str = "{path} line {line}") -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for each non-blank line of a jsonl file; a line that is not
    JSON is an error naming the file and the line (as `where` spells them)."""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            raise ContractError(where.format(path=path, line=i), f"not valid JSON ({e})") from None


def load_contract(model: type[C], path: Path, schema: str, missing: str) -> C:
    """A JSON contract file (manifest, checkpoint state): parsed, its `schema` checked against the
    version this reader reads, and validated; `missing` says what an absent file means."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(path, missing) from None
    except json.JSONDecodeError as e:
        raise ContractError(path, f"not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ContractError(path, "expected a JSON object")
    if raw.get("schema") != schema:
        raise ContractError(path, f"schema is {raw.get('schema')!r}, this reader expects {schema!r}", field="schema")
    return validate(model, raw, path)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The one YAML file loader of every config and spec: a mapping, with duplicate keys refused
    (both line numbers named)."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except _DuplicateKey as e:
        raise ContractError(path, str(e), field=str(e.key)) from None
    except FileNotFoundError:
        raise ContractError(path, "config file not found") from None
    except yaml.YAMLError as e:
        raise ContractError(path, f"not valid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ContractError(path, "expected a mapping at the top level")
    return data


def load_config(model: type[C], path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> C:
    """Load `model` from a YAML file plus overrides; errors name the file and the field."""
    data = load_yaml(path) if path else {}
    data = apply_overrides(data, overrides or [])
    return validate(model, data, path)
