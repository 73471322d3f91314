"""What every domain generator needs from the synth engine, in one place: a request to a teacher
role with a derived seed (so reruns hit the cache and n samples are n distinct requests), usage
accounting, the teacher description a record carries, rubric judges, and record building.

The engine's model (`synth.pipeline`): a row is one prompt; steps add candidates to named fields,
reject them with a reason, or drop the row; `count(row, n_in, n_out)` feeds the per-step
acceptance in the run manifest.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field

from common.hashing import stable_id
from synth.client import ChatRequest, ChatResult, RetriesExhausted
from synth.pipeline import Candidate, Row, RowError, Step, derive_seed
from common.records import Message, SynthRecord, TeacherInfo, Verification


class StepCfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


def render(template: str, fields: dict[str, Any]) -> str:
    """`template.format_map(fields)` with an error that names the missing field."""
    try:
        return template.format_map(fields)
    except KeyError as e:
        raise ValueError(f"prompt template {template[:60]!r} uses {{{e.args[0]}}}, which is not available "
                         f"(available: {', '.join(sorted(fields))})") from None


def _account(row: Row, res: ChatResult) -> None:
    row.usage["requests"] += 1
    row.usage["cached"] += int(res.cached)
    row.usage["prompt_tokens"] += res.prompt_tokens
    row.usage["completion_tokens"] += res.completion_tokens


def request_seed(step: Step, row: Row, *key: Any) -> int:
    return derive_seed(step.env.seed, row.id, step.name, *key)


async def ask(step: Step, row: Row, role: str, messages: list[dict[str, Any]], *key: Any,
              params: dict[str, Any] | None = None, json_schema: dict[str, Any] | None = None,
              tools: list[dict[str, Any]] | None = None, tool_choice: str | dict[str, Any] | None = None) -> ChatResult:
    """One chat request to the teacher `role`; `key` identifies it within the row (its seed).
    `tools`/`tool_choice` make it a native tool-calling request (the result's `tool_calls`)."""
    backend = step.env.backend(role)
    req = ChatRequest(messages=messages, params=dict(params or {}), seed=request_seed(step, row, *key),
                      json_schema=json_schema, tools=tools, tool_choice=tool_choice)
    try:
        res = await backend.complete(req)
    except RetriesExhausted as e:
        raise RowError(f"prompt {row.id}: teacher '{role}' ({backend.cfg.model}) failed in step {step.name}: {e}") from e
    _account(row, res)
    return res


async def ask_all(step: Step, row: Row, role: str, requests: Iterable[tuple[list[dict[str, Any]], tuple]],
                  params: dict[str, Any] | None = None, json_schema: dict[str, Any] | None = None) -> list[ChatResult]:
    return list(await asyncio.gather(*(ask(step, row, role, msgs, *key, params=params, json_schema=json_schema)
                                       for msgs, key in requests)))


def teacher_info(step: Step, role: str, params: dict[str, Any] | None, seed: int | None) -> dict[str, Any]:
    cfg = step.env.backend(role).cfg
    p = params or {}
    return {"model": cfg.model, "role": role, "engine": cfg.engine, "temperature": p.get("temperature"),
            "top_p": p.get("top_p"), "top_k": p.get("top_k"), "max_tokens": p.get("max_tokens"), "seed": seed}


def add_candidate(step: Step, row: Row, field: str, text: str, role: str, params: dict[str, Any] | None,
                  res: ChatResult | None, seed: int | None, **parsed: Any) -> Candidate:
    cands = row.candidates.setdefault(field, [])
    c = Candidate(field=field, index=len(cands), text=text, teacher_role=role, result=res,
                  teacher=teacher_info(step, role, params, seed), parsed=dict(parsed))
    cands.append(c)
    return c


# ---- rubric judges ---------------------------------------------------------------------------

SCORE_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                                 "reason": {"type": "string"}}, "required": ["score"]}
_SCORE_RE = re.compile(r"score\W{0,4}(\d+(?:\.\d+)?)", re.IGNORECASE)
_VERDICT_RE = re.compile(r"\b(PASS|FAIL)\b")


def parse_score(text: str, lo: float = 1, hi: float = 5) -> float | None:
    """A 1-5 score from `{"score": 4}`, `Score: 4` or a reply that is just a number; None otherwise."""
    s = text.strip().strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(s)
        if isinstance(obj, dict) and isinstance(obj.get("score"), (int, float)) and not isinstance(obj["score"], bool):
            v = float(obj["score"])
            return v if lo <= v <= hi else None
    except (json.JSONDecodeError, ValueError):
        pass
    m = _SCORE_RE.search(text) or re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*", text)
    if m:
        v = float(m.group(1))
        return v if lo <= v <= hi else None
    return None


def parse_pass_fail(text: str) -> bool | None:
    """PASS/FAIL (the last one stated), or JSON {"verdict": "pass"|true}; None when neither."""
    s = text.strip().strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(s)
        if isinstance(obj, dict):
            v = obj.get("verdict")
            if isinstance(v, bool):
                return v
            if isinstance(v, str) and v.upper() in ("PASS", "FAIL"):
                return v.upper() == "PASS"
    except (json.JSONDecodeError, ValueError):
        pass
    found = _VERDICT_RE.findall(text.upper())
    return (found[-1] == "PASS") if found else None


VERDICT_SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["PASS", "FAIL"]},
                                                   "reason": {"type": "string"}}, "required": ["verdict"]}


class RubricCfg(StepCfg):
    """One LLM critic: a named rubric scored 1-5, passing at `min_score`."""

    name: str
    description: str
    min_score: float = 4


class JudgeParams(StepCfg):
    teacher: str = "judge"
    params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 128})
    constrained: bool = True       # ask for JSON-schema constrained output where the server supports it


async def score_rubric(step: Step, row: Row, judge: JudgeParams, rubric: RubricCfg, prompt: str, *key: Any
                       ) -> dict[str, Any]:
    """Ask the judge for one rubric; returns {name, score, pass, reason} (unparseable -> fail)."""
    res = await ask(step, row, judge.teacher, [{"role": "user", "content": prompt}], rubric.name, *key,
                    params=judge.params, json_schema=SCORE_SCHEMA if judge.constrained else None)
    score = parse_score(res.content)
    reason = ""
    try:
        obj = json.loads(res.content.strip().strip("`").removeprefix("json").strip())
        reason = str(obj.get("reason", "")) if isinstance(obj, dict) else ""
    except (json.JSONDecodeError, ValueError):
        reason = res.content.strip()[:200]
    return {"name": rubric.name, "score": score, "pass": score is not None and score >= rubric.min_score,
            "reason": reason if score is not None else f"unparseable judge reply: {res.content.strip()[:120]!r}"}


# ---- records ---------------------------------------------------------------------------------

def build_record(step: Step, row: Row, key: Iterable[Any], messages: list[dict[str, Any]], *,
                 teacher: dict[str, Any] | None, verification: Verification | None, meta: dict[str, Any],
                 category: str | None = None, source: str = "", tools: list[dict[str, Any]] | None = None) -> SynthRecord:
    """An `sft` record (contract 6) with a stable id from the generator, the prompt id and `key`;
    `tools` are the tool definitions the conversation exposed (the record's `tools` field)."""
    gen = step.env.generator
    t = {k: v for k, v in (teacher or {}).items() if k in TeacherInfo.model_fields}
    return SynthRecord(
        id=stable_id(gen.generator, row.id, *key), kind="sft", generator=gen.generator, prompt_id=row.id,
        source=source or str(row.fields.get("source") or ""), category=category or gen.category,
        license=gen.license, messages=[Message(**m) for m in messages], tools=tools,
        teacher=TeacherInfo(**t) if t else None, verification=verification, meta=meta)
