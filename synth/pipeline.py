"""The generator model: a generator is a YAML file naming teachers, a prompt source, a list of
per-prompt steps and a list of dataset-level post steps. Steps and sources are registered
classes, so a domain generator adds its own in a few lines:

    from purokit.config import StrictModel
    from synth.pipeline import Step, register_step, Row

    @register_step("execute_sql")
    class ExecuteSql(Step):
        class Config(StrictModel):
            field: str = "sql"
        async def apply(self, row: Row) -> None:
            await self.keep(row, self.cfg.field, lambda c: self.check(run_it, c.text))

`keep` is datatrove's base-filter habit: the check returns None (keep) or the reason, and the
base class rejects, quarantines and counts; `check` runs a pure function in the check pool
(another process, under a time limit), `ask` sends a request to a teacher role with a derived
seed, `add_candidate` and `record` build the row's candidates and its contract-6 records, and
`sample` is the opening most domain steps share: ask the step's teacher with its template, once per
`Ask`, and add the replies as candidates in request order.

A row is one prompt travelling through the steps: its source `fields` (prompt, reference, ...),
named candidate lists that `generate` fills (one candidate per sampled response), and the
`records` that format steps emit. Rejections are recorded with the step and the reason
(quarantined, never silently dropped); every step's in/out counts go to the run manifest.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar, Iterable

from pydantic import BaseModel, Field, create_model

from purokit.config import StrictModel, validate
from purokit.hashing import stable_id
from purokit.records import Message, SynthRecord, TeacherInfo, Verification
from synth.checkpool import check_pool
from synth.client import ChatRequest, ChatResult, RetriesExhausted, TeacherConfig

# ---- configuration ------------------------------------------------------------------------------


class OutputConfig(StrictModel):
    formats: list[str] = Field(default_factory=lambda: ["jsonl"])   # jsonl, parquet, datasets
    max_inflight_rows: int = 256            # prompts in flight at once (requests are bounded per endpoint)
    max_error_rows: int | None = None       # abort when more prompts than this fail for good
    keep_reject_text_chars: int = 4000      # how much of a rejected response the quarantine keeps
    check_timeout_s: float = 20.0           # per verifier/validator call (synth.checkpool); past it: verdict timeout
    check_workers: int | None = None        # check-pool processes (default: min(4, CPUs))
    progress_every_s: float = 30.0          # a progress line this often when the run reports to a log


class GeneratorConfig(StrictModel):
    """A generator: `python -m synth <name|path.yaml> --out DIR [key=value ...]`."""
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
    messages: list[dict[str, Any]] | None = None              # the request that produced it, as sent
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


@dataclass(frozen=True)
class Ask:
    """One request of `Step.sample`: the fields its template is rendered over, its key within the
    row (which seeds the request), and what the reply's candidate starts with in `parsed`."""
    fields: dict[str, Any]
    key: tuple[Any, ...]
    parsed: dict[str, Any] = field(default_factory=dict)


def sampling_config(teacher: str, template: str, **params: Any) -> type[StrictModel]:
    """The Config base of a step that asks one teacher with one template (`Step.ask_template`,
    `Step.sample`): `teacher` (the role), `template` and the request `params`, with the step's
    defaults. `class Config(sampling_config("solver", SOLVE_PROMPT, temperature=0.7)): n: int = 4`."""
    return create_model("SamplingConfig", __base__=StrictModel, teacher=(str, teacher), template=(str, template),
                        params=(dict[str, Any], Field(default_factory=lambda: dict(params))))


class RowError(RuntimeError):
    """A prompt could not be processed this run (e.g. a request failed after every retry). The
    row is not journaled, so the next run retries it."""


# ---- registries ------------------------------------------------------------------------------------

STEPS: dict[str, type["Step"]] = {}
POST_STEPS: dict[str, type["PostStep"]] = {}
SOURCES: dict[str, Callable[..., Iterable[dict[str, Any]]]] = {}


def _registrar(registry: dict[str, type], what: str, kind: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if kind in registry and registry[kind] is not cls:
            raise ValueError(f"{what} kind {kind!r} is already registered by {registry[kind].__module__}")
        cls.kind = kind
        registry[kind] = cls
        return cls
    return deco


def register_step(kind: str) -> Callable[[type["Step"]], type["Step"]]:
    return _registrar(STEPS, "step", kind)


def register_post_step(kind: str) -> Callable[[type["PostStep"]], type["PostStep"]]:
    return _registrar(POST_STEPS, "post step", kind)


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


def render(template: str, fields: dict[str, Any]) -> str:
    """`template.format_map(fields)` with an error that names the missing field (the one template
    formatter of every step)."""
    try:
        return template.format_map(fields)
    except KeyError as e:
        raise ValueError(f"template {template[:60]!r} uses field {{{e.args[0]}}}, which the row does not have "
                         f"(fields: {', '.join(sorted(fields))})") from None


class _Base:
    kind: ClassVar[str] = ""

    class Config(StrictModel):
        pass

    def __init__(self, name: str, cfg: Any, env: Any):
        self.name = name
        self.cfg = cfg
        self.env = env

    @classmethod
    def parse_config(cls, raw: dict[str, Any], where: str) -> BaseModel:
        data = {k: v for k, v in raw.items() if k not in ("kind", "name")}
        return validate(cls.Config, data, f"{where} ({cls.kind})")

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, **self.cfg.model_dump(mode="json")}


Check = Callable[["Candidate"], "str | None | Awaitable[str | None]"]


class Step(_Base, abc.ABC):
    """A per-prompt step. Subclasses define `Config` (a `StrictModel`) and `async apply(row)`.

    `self.env` gives the run: `env.backend(role)`, `env.generator` (the config), `env.seed`.
    The base class owns what every step does: `ask` a teacher, `add_candidate`, (for a step whose
    Config is a `sampling_config`) `ask_template` and `sample` (both at once), `keep` the
    candidates a check passes (rejecting and counting the rest), `check` in the check pool,
    `record` a contract-6 record, `count(row, n_in, n_out, stage=)` for the manifest, and
    `alive` / `first_alive` to read what earlier steps kept.
    """

    @abc.abstractmethod
    async def apply(self, row: Row) -> None:
        """Transform `row` in place: add candidates, reject some, emit records, or drop it."""

    def close(self) -> None:
        """Release what the step holds for the run (a server it started); called once when the run ends."""

    # ---- candidates, rejections, counts ------------------------------------------------------
    @staticmethod
    def alive(row: Row, field_name: str) -> list[Candidate]:
        return [c for c in row.candidates.get(field_name, []) if c.alive]

    def first_alive(self, row: Row, field_name: str) -> Candidate | None:
        """The first alive candidate of a field (what a later step builds on); None when there is
        none, and then the step counts (0 in, 0 out), so the manifest still lists it."""
        cands = self.alive(row, field_name)
        if not cands:
            self.count(row, 0, 0)
            return None
        return cands[0]

    def reject(self, row: Row, cand: Candidate, reason: str) -> None:
        cand.alive = False
        cand.reason = f"{self.name}: {reason}"
        keep = self.env.generator.output.keep_reject_text_chars
        row.rejects.append({"prompt_id": row.id, "step": self.name, "field": cand.field, "candidate": cand.index,
                            "reason": reason, "text": cand.text[:keep], "level": "candidate"})

    def count(self, row: Row, n_in: int, n_out: int, stage: str | None = None) -> None:
        """Add to this step's in/out counts, or to a sub-stage's (`<step>.<stage>` in the manifest)."""
        c = row.step_counts.setdefault(f"{self.name}.{stage}" if stage else self.name, [0, 0])
        c[0] += n_in
        c[1] += n_out

    async def keep(self, row: Row, cands: str | list[Candidate], check: Check, stage: str | None = None) -> list[Candidate]:
        """Run `check(candidate) -> reason | None` (sync or async; async ones concurrently) over the
        alive candidates of a field (or the given ones); reject those with a reason, count in and
        out, and return the kept ones in order."""
        todo = self.alive(row, cands) if isinstance(cands, str) else list(cands)
        found = [check(c) for c in todo]
        pending = [i for i, r in enumerate(found) if inspect.isawaitable(r)]
        if pending:
            done = await asyncio.gather(*(found[i] for i in pending))
            for i, r in zip(pending, done):
                found[i] = r
        kept = []
        for c, why in zip(todo, found):
            if why:
                self.reject(row, c, str(why))
            else:
                kept.append(c)
        self.count(row, len(todo), len(kept), stage)
        return kept

    async def check(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """`fn(*args)` in the check pool (another process) under the run's `output.check_timeout_s`
        (or `timeout_s`); raises `CheckTimeout` past it. `fn` must be a module-level function."""
        out = self.env.generator.output
        return await check_pool(out.check_workers).run(fn, *args, timeout_s=timeout_s or out.check_timeout_s)

    # ---- teacher requests --------------------------------------------------------------------
    def request_seed(self, row: Row, *key: Any) -> int:
        return derive_seed(self.env.seed, row.id, self.name, *key)

    async def ask(self, row: Row, role: str, messages: list[dict[str, Any]], *key: Any,
                  params: dict[str, Any] | None = None, seed: int | None = None, **request: Any) -> ChatResult:
        """One chat request to the teacher `role`, seeded by `key` (its identity within the row,
        unless `seed` is given); `request` holds further `ChatRequest` fields (json_schema, tools,
        tool_choice, logprobs, ...). A request that fails after every retry fails the prompt for
        this run (`RowError`: the next run retries it)."""
        backend = self.env.backend(role)
        req = ChatRequest(messages=messages, params=dict(params or {}),
                          seed=self.request_seed(row, *key) if seed is None else seed, **request)
        try:
            res = await backend.complete(req)
        except RetriesExhausted as e:
            raise RowError(f"prompt {row.id}: teacher '{role}' ({backend.cfg.model}) failed in step {self.name}: {e}") from e
        row.usage["requests"] += 1
        row.usage["cached"] += int(res.cached)
        row.usage["prompt_tokens"] += res.prompt_tokens
        row.usage["completion_tokens"] += res.completion_tokens
        return res

    def teacher_info(self, role: str, params: dict[str, Any] | None, seed: int | None) -> dict[str, Any]:
        cfg = self.env.backend(role).cfg
        p = params or {}
        return {"model": cfg.model, "role": role, "engine": cfg.engine, "temperature": p.get("temperature"),
                "top_p": p.get("top_p"), "top_k": p.get("top_k"), "max_tokens": p.get("max_tokens"), "seed": seed}

    def add_candidate(self, row: Row, field: str, text: str, role: str, params: dict[str, Any] | None,
                      res: ChatResult | None, seed: int | None, **parsed: Any) -> Candidate:
        cands = row.candidates.setdefault(field, [])
        c = Candidate(field=field, index=len(cands), text=text, teacher_role=role, result=res,
                      teacher=self.teacher_info(role, params, seed), parsed=dict(parsed))
        cands.append(c)
        return c

    async def ask_template(self, row: Row, fields: dict[str, Any], *key: Any) -> ChatResult:
        """`ask` the step's teacher (`cfg.teacher`, under `cfg.params`) one user message: the step's
        `cfg.template` rendered over `fields`, seeded by `key`."""
        return await self.ask(row, self.cfg.teacher, [{"role": "user", "content": render(self.cfg.template, fields)}], *key,
                              params=self.cfg.params)

    async def sample(self, row: Row, field: str, *asks: Ask,
                     text: Callable[[str], str] = lambda reply: reply) -> list[Candidate]:
        """`ask_template` once per `Ask` (its fields and key), concurrently; each reply (through
        `text`) becomes a candidate of `field` with the ask's `parsed`, in the order of the asks."""
        results = await asyncio.gather(*(self.ask_template(row, a.fields, *a.key) for a in asks))
        return [self.add_candidate(row, field, text(res.content), self.cfg.teacher, self.cfg.params, res,
                                   self.request_seed(row, *a.key), **a.parsed) for a, res in zip(asks, results)]

    # ---- records -----------------------------------------------------------------------------
    def record(self, row: Row, key: Iterable[Any], messages: list[dict[str, Any]], *,
               teacher: dict[str, Any] | None, verification: Verification | None, meta: dict[str, Any],
               category: str | None = None, source: str = "", tools: list[dict[str, Any]] | None = None) -> SynthRecord:
        """Append an `sft` record (contract 6) with a stable id from the generator, the prompt id
        and `key`; `tools` are the tool definitions the conversation exposed."""
        gen = self.env.generator
        t = {k: v for k, v in (teacher or {}).items() if k in TeacherInfo.model_fields}
        rec = SynthRecord(
            id=stable_id(gen.generator, row.id, *key), kind="sft", generator=gen.generator, prompt_id=row.id,
            source=source or str(row.fields.get("source") or ""), category=category or gen.category,
            license=gen.license, messages=[Message(**m) for m in messages], tools=tools,
            teacher=TeacherInfo(**t) if t else None, verification=verification, meta=meta)
        row.records.append(rec)
        return rec


class PostStep(_Base, abc.ABC):
    """A dataset-level step over all finished records (sorted by prompt order), e.g. cleaning
    and curriculum ordering. Returns the kept records and a list of removals with reasons."""

    @abc.abstractmethod
    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        """(kept records, removals as {record id, reason, ...})."""


