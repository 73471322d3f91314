"""Decontamination and cleaning of generated data.

- n-gram overlap with evaluation examples (13 words by default, the GPT-3 / Llama convention the
  Llama-Nemotron note cites as the baseline that Yang et al. 2023 improve on, §9). Evaluation
  texts shorter than n words are matched whole, so a short benchmark question copied verbatim is
  still caught. Tokens are lower-cased word characters, so punctuation and spacing changes do not
  hide a copy; paraphrases do (that is the LLM-judge stage's job, not this one).
- exact duplicate conversations (after whitespace normalization; the first in output order stays);
- empty conversations (no user text or no assistant text).

Every removal is reported with its reason and evidence (benchmark, eval example id, the shared
n-gram). Running the cleaner on its own output removes nothing (idempotent).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq

from purokit.errors import ContractError
from purokit.records import SynthRecord

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> Iterable[tuple[str, ...]]:
    for i in range(len(tokens) - n + 1):
        yield tuple(tokens[i: i + n])


@dataclass
class EvalIndex:
    """n-grams of evaluation examples -> (benchmark, example id). Short examples are indexed
    whole under their own length."""
    n: int = 13
    grams: dict[int, dict[tuple[str, ...], tuple[str, str]]] = field(default_factory=dict)
    n_examples: dict[str, int] = field(default_factory=dict)

    def add(self, benchmark: str, example_id: str, text: str) -> None:
        toks = words(text)
        if not toks:
            return
        self.n_examples[benchmark] = self.n_examples.get(benchmark, 0) + 1
        length = min(self.n, len(toks))
        table = self.grams.setdefault(length, {})
        for g in ngrams(toks, length):
            table.setdefault(g, (benchmark, example_id))

    def find(self, text: str) -> tuple[str, str, str] | None:
        """(benchmark, example id, shared n-gram) for the first overlap in `text`, else None."""
        toks = words(text)
        for length, table in sorted(self.grams.items(), reverse=True):
            for g in ngrams(toks, length):
                hit = table.get(g)
                if hit is not None:
                    return hit[0], hit[1], " ".join(g)
        return None

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for length in sorted(self.grams):
            h.update(str((length, len(self.grams[length]))).encode())
        h.update(json.dumps(self.n_examples, sort_keys=True).encode())
        return h.hexdigest()[:16]


def load_eval_texts(spec: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """(benchmark name, [(example id, text)]) from `{name, path, fields: [question, ...], id_field}`
    (jsonl/json/parquet file or directory, or a `datasets` save_to_disk directory) or
    `{name, dataset, split, fields}` (loaded offline with `datasets.load_dataset`)."""
    name = spec.get("name") or Path(str(spec.get("path") or spec.get("dataset"))).stem
    text_fields = spec.get("fields") or [spec.get("field", "question")]
    id_field = spec.get("id_field")
    rows: list[dict[str, Any]]
    if spec.get("dataset"):
        import datasets
        rows = list(datasets.load_dataset(spec["dataset"], split=spec.get("split", "test")))
    else:
        p = Path(spec["path"])
        if not p.exists():
            raise ContractError(p, f"evaluation set '{name}' not found")
        if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
            import datasets
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[spec.get("split", "test")]
            rows = list(ds)
        else:
            files = sorted(p.rglob("*")) if p.is_dir() else [p]
            rows = []
            for f in files:
                if f.suffix in (".jsonl", ".json"):
                    rows += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
                elif f.suffix == ".parquet":
                    rows += pq.read_table(f).to_pylist()
    out = []
    for i, r in enumerate(rows):
        missing = [f for f in text_fields if f not in r]
        if missing:
            raise ContractError(spec.get("path") or spec.get("dataset"), f"example {i} has no field {missing[0]!r}; "
                                f"fields: {', '.join(r)}", field=missing[0])
        text = "\n".join(str(r[f]) for f in text_fields if r[f] is not None)
        out.append((str(r[id_field]) if id_field else str(i), text))
    return name, out


def build_eval_index(specs: list[dict[str, Any]], n: int = 13) -> EvalIndex:
    idx = EvalIndex(n=n)
    for spec in specs:
        name, items = load_eval_texts(spec)
        for ex_id, text in items:
            idx.add(name, ex_id, text)
    return idx


def conversation_text(rec: SynthRecord, roles: tuple[str, ...] = ("user", "assistant")) -> str:
    parts = [m.content or "" for m in rec.messages if m.role in roles]
    if rec.prompt and not rec.messages:
        parts.append(rec.prompt)
    return "\n".join(parts)


def is_empty_conversation(rec: SynthRecord) -> bool:
    if rec.kind != "sft":
        return not (rec.prompt or "").strip() and not rec.messages
    user = any(m.role == "user" and (m.content or "").strip() for m in rec.messages)
    assistant = any(m.role == "assistant" and ((m.content or "").strip() or m.tool_calls) for m in rec.messages)
    return not (user and assistant)


def conversation_key(rec: SynthRecord) -> str:
    """Identity for exact-duplicate detection: kind, system and every message, whitespace-normalized."""
    msgs = [(m.role, re.sub(r"\s+", " ", (m.content or "")).strip(),
             json.dumps([tc.model_dump() for tc in m.tool_calls], sort_keys=True) if m.tool_calls else "")
            for m in rec.messages]
    payload = json.dumps([rec.kind, rec.system, msgs, rec.prompt if not rec.messages else None], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def clean_records(records: list[SynthRecord], index: EvalIndex | None = None,
                  roles: tuple[str, ...] = ("user", "assistant"), drop_duplicates: bool = True,
                  drop_empty: bool = True) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
    """(kept, removals). Checks run in order empty -> duplicate -> n-gram overlap; each removal
    names the record, the reason and its evidence."""
    kept: list[SynthRecord] = []
    removals: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for rec in records:
        if drop_empty and is_empty_conversation(rec):
            removals.append({"id": rec.id, "prompt_id": rec.prompt_id, "reason": "empty_conversation"})
            continue
        if drop_duplicates:
            key = conversation_key(rec)
            if key in seen:
                removals.append({"id": rec.id, "prompt_id": rec.prompt_id, "reason": "exact_duplicate",
                                 "duplicate_of": seen[key]})
                continue
            seen[key] = rec.id
        if index is not None:
            hit = index.find(conversation_text(rec, roles))
            if hit is not None:
                removals.append({"id": rec.id, "prompt_id": rec.prompt_id, "reason": "ngram_overlap",
                                 "benchmark": hit[0], "eval_id": hit[1], "ngram": hit[2], "n": index.n})
                continue
        kept.append(rec)
    return kept, removals


def removal_summary(removals: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in removals:
        key = r["reason"] + (f":{r['benchmark']}" if r.get("benchmark") else "")
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
