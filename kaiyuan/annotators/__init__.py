"""Annotators: the node types of the score job, registered by the `type` of their YAML entry.

An annotator adds columns to documents and never drops any (retention is decided later, by a
mixture spec). Each one is a small class with one job:

- `output_fields()`: the Arrow fields it adds (Document contract names: `quality.<name>`,
  `filter.<name>` + `filter.<name>.reason`, `lang`/`lang_score`, `n_tokens`);
- `files()`: local files the executors need (model files), shipped with `SparkContext.addFile`;
- `setup(resolve)`: on the executor, load models; `resolve(path)` gives the executor-local copy;
- `annotate(texts)`: one batch of texts -> a list of values per output column.

Adding a node type: write the class, decorate it with `@register("<type>")`, and add its config
model to `kaiyuan.config.AnnotatorConfig`.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from typing import Any, Callable, Optional

import pyarrow as pa

REGISTRY: dict[str, type["Annotator"]] = {}


def register(type_name: str):
    def deco(cls: type["Annotator"]) -> type["Annotator"]:
        REGISTRY[type_name] = cls
        cls.type_name = type_name
        return cls
    return deco


class Annotator(ABC):
    type_name = ""

    def __init__(self, config: Any):
        self.config = config

    @abstractmethod
    def output_fields(self) -> list[pa.Field]:
        ...

    def files(self) -> list[str]:
        return []

    def setup(self, resolve: Callable[[str], str]) -> None:
        """Load what `annotate` needs (called once per task on the executor)."""

    @abstractmethod
    def annotate(self, texts: list[str]) -> dict[str, list]:
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records about this annotator."""
        return {"type": self.type_name, **self.config.model_dump(mode="json", exclude={"type"})}

    def applies_to(self, source: str) -> bool:
        return self.config.sources is None or source in self.config.sources


def build(config: Any) -> Annotator:
    for module in ("datatrove_filters", "fasttext_models", "tokens"):     # importing them registers their classes
        importlib.import_module(f"kaiyuan.annotators.{module}")

    try:
        cls = REGISTRY[config.type]
    except KeyError:
        raise ValueError(f"unknown annotator type {config.type!r} (known: {sorted(REGISTRY)})") from None
    return cls(config)


# ---- executor-side model cache (Python workers are reused across tasks) ----------------------

_MODELS: dict[tuple[str, str], Any] = {}


def cached(kind: str, path: str, load: Callable[[str], Any]) -> Any:
    key = (kind, os.path.realpath(path))
    if key not in _MODELS:
        _MODELS[key] = load(path)
    return _MODELS[key]


def local_resolver(path: str) -> str:
    return path


def check_file(path: Optional[str], what: str) -> str:
    if not path:
        raise ValueError(f"{what}: no file given")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what}: {path} does not exist")
    return path
