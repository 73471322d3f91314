"""Typed YAML configs with command-line overrides (`key.sub=value`), layered as
defaults < file < overrides. Each command owns one pydantic model for its config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from common.errors import ContractError

C = TypeVar("C", bound=BaseModel)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=3` -> (['a', 'b'], 3). The value is parsed as YAML, so numbers, bools and lists work."""
    if "=" not in item:
        raise ValueError(f"override {item!r} is not of the form key.sub=value")
    key, value = item.split("=", 1)
    return key.strip().split("."), yaml.safe_load(value)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        keys, value = parse_override(item)
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: '{k}' is not a mapping")
        node[keys[-1]] = value
    return data


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ContractError(path or "<overrides>", f"{err['msg']} (input: {err.get('input')!r:.80})", field=field) from None
