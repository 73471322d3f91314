"""SFT / RL records (ARCHITECTURE.md contract 6): the one schema, reader and writer for what synth
emits and what the mixtures SFT packer and RL trainers read (`read_conversations` is the
trainer's view: messages and tools of every trainable record of jsonl or parquet files).

Field names mirror the released Llama-Nemotron / Nemotron post-training datasets (`messages`,
`reasoning`, `generator`, `category`, `license`; anchors.md §2.2) plus what an audit needs:
`teacher` (model + sampling parameters), `verification` (method, verdict, score, the rule that
admitted it), `pair_id`/`pair_role` (Llama-Nemotron §3.2 strict pairs vs mode-specific bulk),
`answer_source` (reference or majority vote, LN §2.1).

Three kinds share the schema:
- `sft`: `messages` = [system `detailed thinking on|off`, user, assistant] (OpenAI chat messages,
  `tool_calls` where used); `system` and `reasoning` repeat the toggle for filtering; `tools`,
  for tool-use conversations, the OpenAI tool definitions the conversation exposed (what a chat
  template renders into the system prompt when the record is trained on).
- `rl_prompt`: `prompt`, `reference`, `verifier`, `pass_rate` over `n_samples` from `estimator`
  (LN §6.1), `curriculum_rank`.
- `rl_rollout`: one sampled completion with `rollout` = token ids exactly as the engine sampled
  them, per-token logprobs and how they were computed (engine, temperature, top-p, logprobs mode
  before/after sampling transforms, precision), policy id, finish reason and truncation flag
  (Ring-linear §4.4), and its `reward`.

Versions: `synth-record/2` added `tools` (before it, tool definitions travelled in `meta.tools`).
The reader takes `synth-record/1` records as well and reads them as version 2 without tools.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

import pyarrow.parquet as pq
from pydantic import ConfigDict, Field, field_validator, model_validator

from purokit import atomic
from purokit.config import StrictModel, iter_jsonl, validate
from purokit.errors import ContractError

RECORD_SCHEMA = "synth-record/2"
READABLE_SCHEMAS = ("synth-record/1", RECORD_SCHEMA)     # /1: the same without `tools`
SYSTEM_ON = "detailed thinking on"
SYSTEM_OFF = "detailed thinking off"
TOGGLE = {"on": SYSTEM_ON, "off": SYSTEM_OFF}


class ToolCallFunction(StrictModel):
    name: str
    arguments: str                      # JSON text, as the OpenAI protocol carries it


class ToolCall(StrictModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(StrictModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


def tool_definition_shape(tool: Any, i: int = 0) -> str | None:
    """Why `tool` is not an OpenAI tool definition (`{"type": "function", "function": {"name",
    "description"?, "parameters"?: JSON-schema object, "strict"?}}`), or None. The definitions are
    kept as given (not re-serialized), since a chat template renders them verbatim."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        return f"tools[{i}]: expected {{'type': 'function', 'function': {{...}}}}"
    extra = set(tool) - {"type", "function"}
    if extra:
        return f"tools[{i}]: unknown keys {sorted(extra)}"
    fn = tool["function"]
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        return f"tools[{i}].function.name must be a non-empty string"
    extra = set(fn) - {"name", "description", "parameters", "strict"}
    if extra:
        return f"tools[{i}].function ({fn['name']}): unknown keys {sorted(extra)}"
    if "description" in fn and not isinstance(fn["description"], str):
        return f"tools[{i}].function ({fn['name']}).description must be a string"
    if "parameters" in fn and not isinstance(fn["parameters"], dict):
        return f"tools[{i}].function ({fn['name']}).parameters must be a JSON schema object"
    return None


class TeacherInfo(StrictModel):
    """Which model answered and how it sampled (LN testable behaviour 10: temperature and top-p
    on every record). The endpoint URL is not recorded: with load spreading it varies between
    runs, and records must be byte-identical for the same inputs, config and seeds."""
    model: str
    role: str = ""                      # the generator's name for it: reasoning, instruct, judge, policy
    engine: str = "unknown"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    reasoning_field: str | None = None  # where the thinking came: reasoning_content | reasoning (None: in the text)


class Verification(StrictModel):
    method: str                         # math_equivalence, mcq_letter, judge, reward, majority_vote, format
    verdict: bool
    score: float | None = None
    rule: str = ""                      # what admitted it: reference, majority_vote, judge:<model>, reward>=t
    detail: str | None = None


class Rollout(StrictModel):
    """Everything a PPO-style trainer needs to use the engine's own probabilities as pi_old
    (Ring-linear §4.2, Eq. 5), and to decide whether it may."""
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    rollout_logprobs: list[float] | None = None
    logprobs_mode: str = "raw_logprobs"     # vLLM V1 default: computed before temperature/top-p
    logprobs_after_sampling_transforms: bool = False
    engine: str = "unknown"
    precision: str = "unknown"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    policy: str = ""                        # model id / weights version that sampled
    finish_reason: str | None = None
    truncated: bool = False
    max_context: int | None = None
    token_ids_source: str = "none"          # engine (return_token_ids / token_id:N) | none
    # where engine, precision and logprobs_mode come from: `endpoint` (the server reported it:
    # vLLM's /v1/models, /version, /server_info) or `declared` (the generator's teacher config)
    engine_source: Literal["endpoint", "declared"] = "declared"
    precision_source: Literal["endpoint", "declared"] = "declared"
    logprobs_mode_source: Literal["endpoint", "declared"] = "declared"
    engine_version: str | None = None
    # Llama-Nemotron §5.1's format reward for the reasoning toggle: 1 when the sample has the
    # think-block layout its mode asks for, 0 otherwise (None: no toggle)
    format_reward: float | None = None

    @model_validator(mode="after")
    def _aligned(self) -> "Rollout":
        ids, lps = self.completion_token_ids, self.rollout_logprobs
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise ValueError(f"{len(lps)} rollout_logprobs for {len(ids)} completion_token_ids")
        if lps is not None and any((not math.isfinite(v)) or v > 1e-6 for v in lps):
            raise ValueError("rollout_logprobs must be finite and <= 0")
        return self


class SynthRecord(StrictModel):
    model_config = ConfigDict(populate_by_name=True)
    schema_: Literal["synth-record/2"] = Field(default=RECORD_SCHEMA, alias="schema")
    id: str
    kind: Literal["sft", "rl_prompt", "rl_rollout"] = "sft"
    generator: str
    prompt_id: str
    source: str = ""
    category: str = ""
    license: str = ""
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None   # OpenAI tool definitions exposed to the conversation
    system: str | None = None
    reasoning: Literal["on", "off"] | None = None
    pair_id: str | None = None
    pair_role: Literal["on", "off"] | None = None
    teacher: TeacherInfo | None = None
    verification: Verification | None = None
    answer_source: str | None = None        # reference | majority_vote | judge
    # RL
    prompt: str | None = None
    reference: str | None = None
    verifier: str | None = None
    pass_rate: float | None = None
    n_samples: int | None = None
    estimator: str | None = None
    curriculum_rank: int | None = None
    reward: float | None = None
    rollout: Rollout | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("tools")
    @classmethod
    def _tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if tools is None:
            return None
        names = set()
        for i, t in enumerate(tools):
            why = tool_definition_shape(t, i)
            if why:
                raise ValueError(why)
            if t["function"]["name"] in names:
                raise ValueError(f"tools[{i}]: duplicate function name {t['function']['name']!r}")
            names.add(t["function"]["name"])
        return tools

    @model_validator(mode="after")
    def _toggle(self) -> "SynthRecord":
        if self.kind == "sft":
            if not self.messages:
                raise ValueError("an sft record needs messages")
            if self.reasoning is not None:
                want = TOGGLE[self.reasoning]
                if self.system != want:
                    raise ValueError(f"reasoning={self.reasoning} needs system exactly {want!r}, got {self.system!r}")
                if self.messages[0].role != "system" or self.messages[0].content != want:
                    raise ValueError(f"reasoning={self.reasoning}: messages[0] must be the system message {want!r}")
        if self.pair_role is not None and self.pair_id is None:
            raise ValueError("pair_role without pair_id")
        if self.kind == "rl_prompt" and self.prompt is None:
            raise ValueError("an rl_prompt record needs prompt")
        if self.pass_rate is not None and not (0.0 <= self.pass_rate <= 1.0):
            raise ValueError(f"pass_rate {self.pass_rate} outside [0, 1]")
        return self

    def to_json_line(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=False),
                          sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"


def validate_record(data: Any, path: str | os.PathLike = "<records>", line: int | None = None) -> SynthRecord:
    where = f"{path}" + (f" line {line}" if line is not None else "")
    if not isinstance(data, dict):
        raise ContractError(where, "a record must be a JSON object")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise ContractError(where, f"schema is {data.get('schema')!r}, this reader reads {' or '.join(READABLE_SCHEMAS)}",
                            field="schema")
    if data["schema"] != RECORD_SCHEMA:             # synth-record/1: read as /2 without tools
        if "tools" in data:
            raise ContractError(where, f"record {data.get('id', '?')}: `tools` is a {RECORD_SCHEMA} field, "
                                f"not one of {data['schema']}", field="tools")
        data = dict(data, schema=RECORD_SCHEMA)
    return validate(SynthRecord, data, f"{where} record {data.get('id', '?')}")


def read_records(path: str | os.PathLike) -> Iterator[SynthRecord]:
    """Validated records from a jsonl file; errors name the file, line, record id and field."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for i, data in iter_jsonl(fh, path):
            yield validate_record(data, path, i)


def write_records(path: str | os.PathLike, records: Iterable[SynthRecord]) -> int:
    lines = [r.to_json_line() for r in records]
    atomic.write_text(path, "".join(lines))
    return len(lines)


# ---- the trainer's view -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Conversation:
    """What an SFT packer trains on: a record's messages (OpenAI chat dicts) and tool definitions."""
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def json_mapping(value: Any) -> dict[str, Any] | None:
    """`value` as a mapping: itself, or what it decodes to when it is JSON text (as parquet exports
    and server endpoints carry nested objects); None when it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def record_tools(rec: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tool definitions of a record: `tools` (a list, or JSON text as the synth parquet export
    writes it), else `meta.tools` (records written before contract 6 had `tools`). ValueError
    when they are not a list of function definitions."""
    tools = rec.get("tools")
    if tools is None:
        meta = json_mapping(rec.get("meta"))
        tools = meta.get("tools") if meta is not None else None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise ValueError(f"tools are not valid JSON ({e.msg})") from None
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance((t.get("function") or {}).get("name"), str)
                                              for t in tools):
        raise ValueError("tools are not a list of tool definitions")
    return tools


def record_problem(rec: dict[str, Any]) -> str | None:
    """Why a record cannot be trained on, or None."""
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "no messages"
    if rec.get("kind") not in (None, "sft"):
        return f"kind {rec.get('kind')!r} is not sft"
    if not any(m.get("role") == "assistant" and ((m.get("content") or "").strip() or m.get("tool_calls")) for m in msgs):
        return "no assistant turn"
    return None


def record_files(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """The record files of `inputs` (files, or directories searched for .jsonl / .parquet)."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".parquet") and not f.name.startswith((".", "_"))))
        elif p.is_file():
            out.append(p)
        else:
            raise ContractError(p, "record input not found", field="inputs")
    return out


def _raw_records(f: Path) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    if f.suffix == ".parquet":
        for i, rec in enumerate(pq.read_table(f).to_pylist()):
            yield i, rec, None
        return
    with open(f, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if line.strip():
                try:
                    yield i, json.loads(line), None
                except json.JSONDecodeError as e:
                    yield i, None, f"not JSON ({e})"


def read_conversations(files: Iterable[Path]) -> Iterator[tuple[str, int, Conversation | None, str | None]]:
    """(file, line/row, conversation, None) for every trainable record of `files`, and
    (file, line/row, None, why) for every other one, so the caller quarantines it with the reason.
    Lenient on purpose: records of any version, parquet exports (tools and meta as JSON text) and
    hand-made chat files (messages only) are read; what cannot be trained on is named."""
    for f in files:
        for i, rec, why in _raw_records(f):
            if rec is not None:
                why = record_problem(rec)
            if why is None:
                try:
                    tools = record_tools(rec)          # type: ignore[arg-type]
                except ValueError as e:
                    why = str(e)
            if why is not None:
                yield str(f), i, None, why
                continue
            assert rec is not None
            yield str(f), i, Conversation(str(rec.get("id") or f"{f.name}:{i}"), rec["messages"], tools), None
