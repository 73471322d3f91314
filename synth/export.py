"""Export records (contract 6) to jsonl, parquet and a Hugging Face `datasets` DatasetDict.

Splits by record kind: `train` (sft), `rl_prompts`, `rl_rollouts`. The parquet/arrow schema is
fixed here (not inferred), so every export of every generator has the same column types and the
mixtures SFT packer reads any of them: `messages` is a list of OpenAI chat messages
(role, content, tool_calls, tool_call_id, name) whose first message is the system toggle
`detailed thinking on|off` for reasoning-toggle data; `tools` (the OpenAI tool definitions of a
tool-use conversation, whose JSON-schema parameters have no fixed arrow type) and `meta` are JSON
text (null when a record has no tools). Exports of `synth-record/1` records (before `tools`)
still load: their columns are the same without `tools`.

`export_manifest.json` beside the files records the schema version, counts and sha256 of each
file; `load_export(dir)` validates it before handing back the DatasetDict.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from purokit import atomic
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.records import READABLE_SCHEMAS, RECORD_SCHEMA, SynthRecord, read_records

EXPORT_SCHEMA = "synth-export/1"
SPLIT_OF_KIND = {"sft": "train", "rl_prompt": "rl_prompts", "rl_rollout": "rl_rollouts"}

_STR = pa.string()
TOOL_CALL = pa.struct([("id", _STR), ("type", _STR), ("function", pa.struct([("name", _STR), ("arguments", _STR)]))])
MESSAGE = pa.struct([("role", _STR), ("content", _STR), ("tool_calls", pa.list_(TOOL_CALL)),
                     ("tool_call_id", _STR), ("name", _STR)])
TEACHER = pa.struct([("model", _STR), ("role", _STR), ("engine", _STR), ("temperature", pa.float64()),
                     ("top_p", pa.float64()), ("top_k", pa.int64()), ("max_tokens", pa.int64()), ("seed", pa.int64()),
                     ("reasoning_field", _STR)])
VERIFICATION = pa.struct([("method", _STR), ("verdict", pa.bool_()), ("score", pa.float64()), ("rule", _STR),
                          ("detail", _STR)])
ROLLOUT = pa.struct([
    ("prompt_token_ids", pa.list_(pa.int64())), ("completion_token_ids", pa.list_(pa.int64())),
    ("rollout_logprobs", pa.list_(pa.float64())), ("logprobs_mode", _STR),
    ("logprobs_after_sampling_transforms", pa.bool_()), ("engine", _STR), ("precision", _STR),
    ("temperature", pa.float64()), ("top_p", pa.float64()), ("top_k", pa.int64()), ("seed", pa.int64()),
    ("policy", _STR), ("finish_reason", _STR), ("truncated", pa.bool_()), ("max_context", pa.int64()),
    ("token_ids_source", _STR), ("engine_source", _STR), ("precision_source", _STR), ("logprobs_mode_source", _STR),
    ("engine_version", _STR), ("format_reward", pa.float64())])
RECORD_ARROW_SCHEMA = pa.schema([
    ("schema", _STR), ("id", _STR), ("kind", _STR), ("generator", _STR), ("prompt_id", _STR), ("source", _STR),
    ("category", _STR), ("license", _STR), ("messages", pa.list_(MESSAGE)), ("tools", _STR), ("system", _STR),
    ("reasoning", _STR),
    ("pair_id", _STR), ("pair_role", _STR), ("teacher", TEACHER), ("verification", VERIFICATION),
    ("answer_source", _STR), ("prompt", _STR), ("reference", _STR), ("verifier", _STR), ("pass_rate", pa.float64()),
    ("n_samples", pa.int64()), ("estimator", _STR), ("curriculum_rank", pa.int64()), ("reward", pa.float64()),
    ("rollout", ROLLOUT), ("meta", _STR),
])


def record_row(rec: SynthRecord) -> dict[str, Any]:
    d = rec.model_dump(mode="json", by_alias=True)
    d["meta"] = json.dumps(d.get("meta") or {}, sort_keys=True, ensure_ascii=False)
    d["tools"] = json.dumps(d["tools"], ensure_ascii=False) if d.get("tools") is not None else None
    return d


def columns_of(record_schema: str) -> set[str]:
    """The export columns of records of `record_schema` (synth-record/1 had no `tools`)."""
    cols = set(RECORD_ARROW_SCHEMA.names)
    return cols - {"tools"} if record_schema == "synth-record/1" else cols


def to_arrow(records: Iterable[SynthRecord]) -> pa.Table:
    return pa.Table.from_pylist([record_row(r) for r in records], schema=RECORD_ARROW_SCHEMA)


def split_records(records: Iterable[SynthRecord]) -> dict[str, list[SynthRecord]]:
    out: dict[str, list[SynthRecord]] = {}
    for r in records:
        out.setdefault(SPLIT_OF_KIND[r.kind], []).append(r)
    return out


def export_records(records: list[SynthRecord], out_dir: str | os.PathLike,
                   formats: Iterable[str] = ("jsonl", "parquet", "datasets")) -> dict[str, Any]:
    """Write each split in each format under `out_dir`; returns the export manifest."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    formats = list(formats)
    unknown = set(formats) - {"jsonl", "parquet", "datasets"}
    if unknown:
        raise ValueError(f"unknown export formats {sorted(unknown)} (jsonl, parquet, datasets)")
    splits = split_records(records) or {"train": []}      # nothing accepted: an empty train split, not none
    files: dict[str, dict[str, Any]] = {}
    for split, recs in sorted(splits.items()):
        if "jsonl" in formats:
            p = out / f"{split}.jsonl"
            atomic.write_text(p, "".join(r.to_json_line() for r in recs))
            files[p.name] = {"split": split, "n_records": len(recs), "sha256": sha256_file(p)}
        if "parquet" in formats:
            p = out / f"{split}.parquet"
            with atomic.atomic_path(p) as tmp:
                pq.write_table(to_arrow(recs), tmp)
            files[p.name] = {"split": split, "n_records": len(recs), "sha256": sha256_file(p)}
    if "datasets" in formats:
        import datasets
        dd = datasets.DatasetDict({split: datasets.Dataset(to_arrow(recs)) for split, recs in sorted(splits.items())})
        was_enabled = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()             # one line per step in callers' logs, not a bar per split
        try:
            with atomic.atomic_path(out / "dataset") as tmp:
                dd.save_to_disk(str(tmp))
        finally:
            if was_enabled:
                datasets.enable_progress_bars()
        files["dataset"] = {"splits": {s: len(r) for s, r in sorted(splits.items())}}
    manifest = {"schema": EXPORT_SCHEMA, "record_schema": RECORD_SCHEMA, "formats": formats,
                "splits": {s: len(r) for s, r in sorted(splits.items())}, "files": files}
    atomic.write_json(out / "export_manifest.json", manifest)
    return manifest


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None,
               formats: Iterable[str] = ("jsonl", "parquet", "datasets")) -> dict[str, Any]:
    run_dir = Path(run_dir)
    records = list(read_records(run_dir / "records.jsonl"))
    return export_records(records, out_dir or run_dir / "export", formats)


def load_export(path: str | os.PathLike) -> Any:
    """The DatasetDict of an export directory, after checking its manifest and column schema."""
    import datasets
    path = Path(path)
    mpath = path / "export_manifest.json"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(mpath, "no export manifest (not a synth export directory?)") from None
    if manifest.get("schema") != EXPORT_SCHEMA:
        raise ContractError(mpath, f"schema is {manifest.get('schema')!r}, expected {EXPORT_SCHEMA!r}", field="schema")
    record_schema = manifest.get("record_schema")
    if record_schema not in READABLE_SCHEMAS:
        raise ContractError(mpath, f"record_schema is {record_schema!r}, expected one of {', '.join(READABLE_SCHEMAS)}",
                            field="record_schema")
    want = columns_of(record_schema)
    if not (path / "dataset").is_dir():
        raise ContractError(path, "export has no `dataset` directory (exported without the datasets format)")
    parts = {}
    for split, n_rows in manifest["splits"].items():
        if n_rows == 0:         # datasets cannot load a saved zero-row split; it is the schema and nothing else
            schema = RECORD_ARROW_SCHEMA
            if "tools" not in want:
                schema = schema.remove(schema.get_field_index("tools"))
            parts[split] = datasets.Dataset(schema.empty_table())
        else:
            parts[split] = datasets.load_from_disk(str(path / "dataset" / split))
    dd = datasets.DatasetDict(parts)
    for split, ds in dd.items():
        have = set(ds.column_names)
        if want != have:
            raise ContractError(path / "dataset" / split, f"columns differ from {record_schema}: "
                                f"missing {sorted(want - have)}, extra {sorted(have - want)}")
        if len(ds) != manifest["splits"].get(split):
            raise ContractError(path / "dataset" / split, f"{len(ds)} rows, the manifest says {manifest['splits'].get(split)}")
    return dd
