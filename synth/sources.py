"""Prompt sources: where a generator's prompts come from.

`source:` in a generator YAML has a `kind` and its parameters:
- `jsonl` / `parquet`: `path` (file or directory of files);
- `datasets`: `path` (a `save_to_disk` directory) or `name` + optional `data_files`/`split`
  (loaded offline through `datasets.load_dataset`);
- `component`: a Component directory (contract 2): `text` becomes the prompt, `meta` fields join;
- `inline`: `items`, a list of mappings in the YAML itself;
- any kind registered with `@register_source` (samplers that build prompts from a seed).

`fields` maps row fields to input fields (`{prompt: problem, reference: answer, id: uid}`); every
other input field is kept under its own name. `dedup: true` drops exact duplicate prompts (after
whitespace/case normalization) before any request is sent, with a count in the manifest.
Prompt ids are the input's id field when mapped, else a hash of the source and the prompt text.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow.parquet as pq

from purokit.component import Component
from purokit.errors import ContractError
from purokit.hashing import stable_id
from synth.pipeline import SOURCES, register_source


def _files(path: Path, suffixes: tuple[str, ...]) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.suffix in suffixes and not p.name.startswith((".", "_")))
    if not path.exists():
        raise ContractError(path, "prompt source not found")
    return [path]


@register_source("jsonl")
def jsonl_source(seed: int, path: str) -> Iterator[dict[str, Any]]:
    for f in _files(Path(path), (".jsonl", ".json")):
        with open(f, encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ContractError(f"{f} line {i}", f"not valid JSON ({e})") from None


@register_source("parquet")
def parquet_source(seed: int, path: str) -> Iterator[dict[str, Any]]:
    for f in _files(Path(path), (".parquet",)):
        yield from pq.read_table(f).to_pylist()


@register_source("datasets")
def datasets_source(seed: int, path: str | None = None, name: str | None = None, split: str = "train",
                    data_files: Any = None) -> Iterator[dict[str, Any]]:
    import datasets
    if path and Path(path).is_dir() and (Path(path) / "dataset_dict.json").exists() or (path and (Path(path) / "dataset_info.json").exists()):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(name or "json", data_files=data_files or path, split=split)
    yield from ds


@register_source("component")
def component_source(seed: int, path: str) -> Iterator[dict[str, Any]]:
    comp = Component.open(path)
    for batch in comp.iter_batches(columns=["id", "text", "source", "meta"]):
        for r in batch.to_pylist():
            row = {"id": r["id"], "prompt": r["text"], "source": r["source"]}
            for k, v in (r.get("meta") or []):
                row.setdefault(k, v)
            yield row


@register_source("inline")
def inline_source(seed: int, items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from items


# ---- a sampler: arithmetic word problems with exact answers -----------------------------------

_NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Jia", "Kofi", "Lena"]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "coins", "stamps"]


def arithmetic_problem(rng: random.Random) -> dict[str, Any]:
    """One word problem and its exact integer answer (one or two operations)."""
    name, other = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    kind = rng.choice(["add", "sub", "mul", "add_sub", "mul_add"])
    a, b, c = rng.randint(2, 40), rng.randint(2, 30), rng.randint(2, 9)
    if kind == "add":
        text, ans = f"{name} has {a} {item}. {other} gives {name} {b} more. How many {item} does {name} have now?", a + b
    elif kind == "sub":
        a = a + b
        text, ans = f"{name} has {a} {item} and gives away {b} to {other}. How many {item} does {name} have left?", a - b
    elif kind == "mul":
        text, ans = f"{name} buys {c} boxes with {b} {item} in each box. How many {item} does {name} buy in total?", b * c
    elif kind == "add_sub":
        a = a + c
        text, ans = (f"{name} has {a} {item}, finds {b} more, then gives {c} to {other}. "
                     f"How many {item} does {name} have now?"), a + b - c
    else:
        text, ans = (f"{name} has {a} {item} and buys {c} packs of {b} {item} each. "
                     f"How many {item} does {name} have now?"), a + b * c
    return {"prompt": text, "reference": str(ans), "category": "math", "operation": kind}


@register_source("arithmetic_word_problems")
def arithmetic_source(seed: int, n: int = 100) -> Iterator[dict[str, Any]]:
    """`n` arithmetic word problems from `seed` (the demo's math prompts when no corpus exists)."""
    rng = random.Random(seed)
    for i in range(n):
        yield dict(arithmetic_problem(rng), id=f"arith-{seed}-{i}")


# ---- loading --------------------------------------------------------------------------------------

def normalize_prompt(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def load_rows(source_cfg: dict[str, Any], seed: int, limit: int | None = None
              ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Rows as dicts with `id` and `prompt` (+ mapped and other fields), and counts of what was
    skipped: duplicates, empty prompts."""
    cfg = dict(source_cfg)
    kind = cfg.pop("kind", None)
    mapping: dict[str, str] = cfg.pop("fields", {}) or {}
    dedup = bool(cfg.pop("dedup", False))
    if kind not in SOURCES:
        raise ValueError(f"unknown source kind {kind!r}; registered: {', '.join(sorted(SOURCES))}")
    try:
        items: Iterable[dict[str, Any]] = SOURCES[kind](seed, **cfg)
    except TypeError as e:
        raise ValueError(f"source '{kind}': {e}") from None
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    counts = {"n_input": 0, "n_duplicate_prompts": 0, "n_empty_prompts": 0}
    ident = cfg.get("path") or cfg.get("name") or kind
    for pos, item in enumerate(items):
        if limit is not None and len(rows) >= limit:
            break
        counts["n_input"] += 1
        row = dict(item)
        for dst, src in mapping.items():
            if src not in item:
                raise ContractError(f"{ident} item {pos}", f"has no field '{src}' (mapped to '{dst}'); "
                                    f"fields: {', '.join(item)}", field=src)
            row[dst] = item[src]
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            counts["n_empty_prompts"] += 1
            continue
        if dedup:
            key = normalize_prompt(prompt)
            if key in seen:
                counts["n_duplicate_prompts"] += 1
                continue
            seen.add(key)
        row["id"] = str(row["id"]) if row.get("id") is not None else stable_id(kind, ident, prompt)
        rows.append(row)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ContractError(ident, f"prompt id {dup!r} occurs more than once; ids must be unique "
                            "(map another field to id, or use dedup: true when prompts repeat)")
    return rows, counts
