"""The generator model: a generator is a YAML file naming teachers, a prompt source, a list of
per-prompt steps and a list of dataset-level post steps. Steps and sources are registered
classes, so a domain generator adds its own in a few lines:

    from synth.pipeline import Step, register_step, Row
    from pydantic import BaseModel

    @register_step("execute_sql")
    class ExecuteSql(Step):
        class Config(BaseModel):
            field: str = "sql"
        async def apply(self, row: Row) -> None:
            for cand in self.alive(row, self.cfg.field):
                ok, why = run_it(cand.text)
                if not ok:
                    self.reject(row, cand, why)

A row is one prompt travelling through the steps: its source `fields` (prompt, reference, ...),
named candidate lists that `generate` fills (one candidate per sampled response), and the
`records` that format steps emit. Rejections are recorded with the step and the reason
(quarantined, never silently dropped); every step's in/out counts go to the run manifest.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from synth.client import ChatResult, TeacherConfig
from synth.records import SynthRecord, Verification

# ---- configuration ------------------------------------------------------------------------------


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    formats: list[str] = Field(default_factory=lambda: ["jsonl"])   # jsonl, parquet, datasets
    max_inflight_rows: int = 256            # prompts in flight at once (requests are bounded per endpoint)
    max_error_rows: int | None = None       # abort when more prompts than this fail for good
    keep_reject_text_chars: int = 4000      # how much of a rejected response the quarantine keeps


class GeneratorConfig(BaseModel):
    """A generator: `python -m synth <name|path.yaml> --out DIR [key=value ...]`."""
    model_config = ConfigDict(extra="forbid")
    generator: str
    version: int = 1
    description: str = ""
    seed: int = 0
    category: str = ""
    license: str = ""
    imports: list[str] = Field(default_factory=list)     # modules that register custom steps/sources/verifiers
    teachers: dict[str, TeacherConfig] = Field(default_factory=dict)
    source: dict[str, Any]
    steps: list[dict[str, Any]] = Field(default_factory=list)
    post: list[dict[str, Any]] = Field(default_factory=list)
    output: OutputConfig = Field(default_factory=OutputConfig)
    limit: int | None = None                # use the first N prompts of the source


# ---- rows and candidates -------------------------------------------------------------------------

@dataclass
class Candidate:
    """One sampled response (or any generated artefact) of one row."""
    field: str
    index: int
    text: str
    teacher_role: str = ""
    teacher: dict[str, Any] = field(default_factory=dict)     # TeacherInfo fields
    mode: str | None = None                                   # on / off / None
    result: ChatResult | None = None
    parsed: dict[str, Any] = field(default_factory=dict)
    verification: Verification | None = None
    alive: bool = True
    reason: str = ""


@dataclass
class Row:
    index: int                                       # position in the source (output order)
    id: str                                          # prompt_id, stable across runs
    fields: dict[str, Any]
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    records: list[SynthRecord] = field(default_factory=list)
    rejects: list[dict[str, Any]] = field(default_factory=list)
    dropped: str | None = None
    step_counts: dict[str, list[int]] = field(default_factory=dict)
    usage: dict[str, int] = field(default_factory=lambda: {"requests": 0, "cached": 0, "prompt_tokens": 0,
                                                           "completion_tokens": 0})

    @property
    def prompt(self) -> str:
        return str(self.fields.get("prompt", ""))

    def drop(self, step: str, reason: str) -> None:
        self.dropped = f"{step}: {reason}"
        self.rejects.append({"prompt_id": self.id, "step": step, "reason": reason, "level": "prompt"})


class RowError(RuntimeError):
    """A prompt could not be processed this run (e.g. a request failed after every retry). The
    row is not journaled, so the next run retries it."""


# ---- registries ------------------------------------------------------------------------------------

STEPS: dict[str, type["Step"]] = {}
POST_STEPS: dict[str, type["PostStep"]] = {}
SOURCES: dict[str, Callable[..., Iterable[dict[str, Any]]]] = {}


def register_step(kind: str) -> Callable[[type["Step"]], type["Step"]]:
    def deco(cls: type[Step]) -> type[Step]:
        if kind in STEPS and STEPS[kind] is not cls:
            raise ValueError(f"step kind {kind!r} is already registered by {STEPS[kind].__module__}")
        cls.kind = kind
        STEPS[kind] = cls
        return cls
    return deco


def register_post_step(kind: str) -> Callable[[type["PostStep"]], type["PostStep"]]:
    def deco(cls: type[PostStep]) -> type[PostStep]:
        if kind in POST_STEPS and POST_STEPS[kind] is not cls:
            raise ValueError(f"post step kind {kind!r} is already registered")
        cls.kind = kind
        POST_STEPS[kind] = cls
        return cls
    return deco


def register_source(kind: str) -> Callable[[Callable[..., Iterable[dict[str, Any]]]], Callable[..., Iterable[dict[str, Any]]]]:
    """Register `fn(seed: int, **params) -> iterable of dicts` (each with at least `prompt`)."""
    def deco(fn: Callable[..., Iterable[dict[str, Any]]]) -> Callable[..., Iterable[dict[str, Any]]]:
        if kind in SOURCES and SOURCES[kind] is not fn:
            raise ValueError(f"source kind {kind!r} is already registered")
        SOURCES[kind] = fn
        return fn
    return deco


def derive_seed(*parts: Any) -> int:
    """A 31-bit request seed from the generator seed and the request's identity."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


class _Base:
    kind: ClassVar[str] = ""

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

    @classmethod
    def parse_config(cls, raw: dict[str, Any], where: str) -> BaseModel:
        data = {k: v for k, v in raw.items() if k not in ("kind", "name")}
        try:
            return cls.Config.model_validate(data)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{where} ({cls.kind}): field '{loc}': {err['msg']}") from None


class Step(_Base, abc.ABC):
    """A per-prompt step. Subclasses define `Config` (pydantic) and `async apply(row)`.

    `self.env` gives the run: `env.backend(role)`, `env.generator` (the config), `env.seed`.
    Helpers count and quarantine: `alive(row, field)`, `reject(row, cand, reason)`, `count(row, n_in, n_out)`.
    """

    def __init__(self, name: str, cfg: Any, env: Any):
        self.name = name
        self.cfg = cfg
        self.env = env

    @abc.abstractmethod
    async def apply(self, row: Row) -> None:
        """Transform `row` in place: add candidates, reject some, emit records, or drop it."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, **self.cfg.model_dump(mode="json")}

    # helpers ---------------------------------------------------------------------------------
    @staticmethod
    def alive(row: Row, field_name: str) -> list[Candidate]:
        return [c for c in row.candidates.get(field_name, []) if c.alive]

    def reject(self, row: Row, cand: Candidate, reason: str) -> None:
        cand.alive = False
        cand.reason = f"{self.name}: {reason}"
        keep = self.env.generator.output.keep_reject_text_chars
        row.rejects.append({"prompt_id": row.id, "step": self.name, "field": cand.field, "candidate": cand.index,
                            "reason": reason, "text": cand.text[:keep], "level": "candidate"})

    def count(self, row: Row, n_in: int, n_out: int) -> None:
        c = row.step_counts.setdefault(self.name, [0, 0])
        c[0] += n_in
        c[1] += n_out


class PostStep(_Base, abc.ABC):
    """A dataset-level step over all finished records (sorted by prompt order), e.g. cleaning
    and curriculum ordering. Returns the kept records and a list of removals with reasons."""

    def __init__(self, name: str, cfg: Any, env: Any):
        self.name = name
        self.cfg = cfg
        self.env = env

    @abc.abstractmethod
    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        """(kept records, removals as {record id, reason, ...})."""

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, **self.cfg.model_dump(mode="json")}
