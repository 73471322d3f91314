"""Seed data of the domain generators: one validated loader per file kind.

Every seed file is YAML (or JSON/JSONL where noted) with a `schema: <kind>/<version>` field; a
loader validates it and fails with a `ContractError` naming the file and the field. The files
shipped in `synth/domains/data/` are written for this project; users point a generator's config
at their own files of the same shape.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, model_validator

from purokit.config import StrictModel, repeated, validate
from purokit.errors import ContractError
from synth.domains.finance_validate import Company, Template, template_problems
from synth.domains.tool_validate import MAX_TOOLS_PER_TASK, tool_definition_problems

DATA_DIR = Path(__file__).parent / "data"


def resolve_seed_path(path: str | os.PathLike) -> Path:
    """`path` as given, or, when it is a bare name that does not exist, the shipped file of that name."""
    p = Path(path)
    if not p.exists() and not p.is_absolute() and len(p.parts) == 1 and (DATA_DIR / p).exists():
        return DATA_DIR / p
    return p


def read_seed_file(path: str | os.PathLike) -> Any:
    path = resolve_seed_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ContractError(path, "seed file not found") from None
    try:
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise ContractError(path, f"not valid {path.suffix.lstrip('.').upper() or 'YAML'} ({e})") from None


def _validate(model: type[BaseModel], raw: Any, path: str | os.PathLike, kind: str) -> Any:
    if not isinstance(raw, dict):
        raise ContractError(path, "expected a mapping at the top level")
    if raw.get("schema") != kind:
        raise ContractError(path, f"schema is {raw.get('schema')!r}, expected {kind!r}", field="schema")
    return validate(model, raw, path)


# ---- tool use -----------------------------------------------------------------------------

def _check_tools(kind: str, id_: str, tools: list[dict[str, Any]], max_tools: int | None = None) -> None:
    """Tool definitions valid (and at most `max_tools`), or a ValueError naming the seed entry."""
    problems = tool_definition_problems(tools)
    if max_tools is not None and len(tools) > max_tools:
        problems.append(f"{len(tools)} tools, at most {max_tools}")
    if problems:
        raise ValueError(f"{kind} {id_!r}: " + "; ".join(problems))


class Toolset(StrictModel):
    id: str
    description: str = ""
    tools: list[dict[str, Any]]

    @model_validator(mode="after")
    def _tools_valid(self) -> "Toolset":
        _check_tools("toolset", self.id, self.tools)
        return self


class ToolsetFile(StrictModel):
    schema_: str = Field(alias="schema")
    toolsets: list[Toolset]

    @model_validator(mode="after")
    def _unique(self) -> "ToolsetFile":
        ids = [t.id for t in self.toolsets]
        if len(set(ids)) != len(ids):
            raise ValueError("toolset ids must be unique")
        dup = repeated(t["function"]["name"] for ts in self.toolsets for t in ts.tools)
        if dup:
            raise ValueError(f"function names must be unique across toolsets (a task may combine toolsets): {dup}")
        return self


def load_toolsets(path: str | os.PathLike = "toolsets.yaml") -> list[Toolset]:
    return _validate(ToolsetFile, read_seed_file(path), path, "toolsets/1").toolsets


class Persona(StrictModel):
    id: str
    description: str


class PersonaFile(StrictModel):
    schema_: str = Field(alias="schema")
    personas: list[Persona]


def load_personas(path: str | os.PathLike = "personas.yaml") -> list[Persona]:
    personas = _validate(PersonaFile, read_seed_file(path), path, "personas/1").personas
    if len({p.id for p in personas}) != len(personas):
        raise ContractError(path, "persona ids must be unique", field="personas")
    return personas


class TopicFile(StrictModel):
    """Topics per conversation type (the paper samples the topic conditioned on the type)."""

    schema_: str = Field(alias="schema")
    topics: dict[Literal["single_turn", "multi_turn", "multi_step"], list[str]]


def load_topics(path: str | os.PathLike = "tool_topics.yaml") -> dict[str, list[str]]:
    return _validate(TopicFile, read_seed_file(path), path, "tool_topics/1").topics


class Domain(StrictModel):
    """A customer-service domain of the conversational pipeline (§2.11), optionally with its
    policy and tools written by hand (otherwise the generator asks the teacher for them)."""

    id: str
    description: str
    subdomains: list[str] = []
    policy: str | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _tools_valid(self) -> "Domain":
        if self.tools is not None:
            _check_tools("domain", self.id, self.tools, MAX_TOOLS_PER_TASK)
        return self


class DomainFile(StrictModel):
    schema_: str = Field(alias="schema")
    domains: list[Domain]


def load_domains(path: str | os.PathLike = "service_domains.yaml") -> list[Domain]:
    return _validate(DomainFile, read_seed_file(path), path, "service_domains/1").domains


# ---- finance ------------------------------------------------------------------------------

class CompanyRow(StrictModel):
    ticker: str = Field(pattern=r"^[A-Z][A-Z.\-]{0,9}$")
    name: str
    gics_sub_industry: str
    sector: str = ""


class CompanyFile(StrictModel):
    schema_: str = Field(alias="schema")
    companies: list[CompanyRow]


def load_companies(path: str | os.PathLike = "companies.yaml") -> list[Company]:
    rows = _validate(CompanyFile, read_seed_file(path), path, "companies/1").companies
    dup = repeated(r.ticker for r in rows)
    if dup:
        raise ContractError(path, f"duplicate tickers {dup}", field="companies")
    return [Company(r.ticker, r.name, r.gics_sub_industry, r.sector) for r in rows]


class TemplateRow(StrictModel):
    id: str
    text: str
    kind: Literal["single", "comparison"] = "single"
    numeric: bool = True
    sections: list[str] = []


class TemplateFile(StrictModel):
    schema_: str = Field(alias="schema")
    templates: list[TemplateRow]


def load_finance_templates(path: str | os.PathLike = "finance_templates.yaml") -> list[Template]:
    rows = _validate(TemplateFile, read_seed_file(path), path, "finance_templates/1").templates
    out = [Template(r.id, r.text, r.kind, r.numeric, tuple(r.sections)) for r in rows]
    for i, t in enumerate(out):
        problems = template_problems(t)
        if problems:
            raise ContractError(path, "; ".join(problems), field=f"templates.{i}")
    if len({t.id for t in out}) != len(out):
        raise ContractError(path, "template ids must be unique", field="templates")
    return out


# ---- text-to-SQL --------------------------------------------------------------------------

class SqlConcept(StrictModel):
    id: str = Field(pattern=r"^[a-z0-9_]+$")
    description: str


class SqlTaxonomy(StrictModel):
    """Industry -> topics, SQL concept buckets, and the prompt-diversity axes (§2.10)."""

    schema_: str = Field(alias="schema")
    industries: dict[str, list[str]]
    concepts: list[SqlConcept]
    instruction_styles: list[str]
    registers: list[str]
    politeness: list[str]

    @model_validator(mode="after")
    def _non_empty(self) -> "SqlTaxonomy":
        for name in ("industries", "concepts", "instruction_styles", "registers", "politeness"):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty")
        empty = [k for k, v in self.industries.items() if not v]
        if empty:
            raise ValueError(f"industries without topics: {empty}")
        if len({c.id for c in self.concepts}) != len(self.concepts):
            raise ValueError("concept ids must be unique")
        return self


def load_sql_taxonomy(path: str | os.PathLike = "sql_taxonomy.yaml") -> SqlTaxonomy:
    return _validate(SqlTaxonomy, read_seed_file(path), path, "sql_taxonomy/1")


# ---- code concepts and MCQ -----------------------------------------------------------------

class ConceptFile(StrictModel):
    schema_: str = Field(alias="schema")
    concepts: list[str]

    @model_validator(mode="after")
    def _dedup(self) -> "ConceptFile":
        dup = repeated(" ".join(c.lower().split()) for c in self.concepts)
        if dup:
            raise ValueError(f"duplicate concepts (the taxonomy must be deduplicated): {dup}")
        if not self.concepts:
            raise ValueError("no concepts")
        return self


def load_concepts(path: str | os.PathLike = "code_concepts.yaml") -> list[str]:
    return _validate(ConceptFile, read_seed_file(path), path, "code_concepts/1").concepts


class McqSeed(StrictModel):
    id: str
    source: str = ""
    question: str
    options: dict[str, str]
    answer: str

    @model_validator(mode="after")
    def _letters(self) -> "McqSeed":
        want = list(string.ascii_uppercase[: len(self.options)])
        if list(self.options) != want or len(self.options) < 2:
            raise ValueError(f"seed {self.id}: options must be lettered {''.join(want) or 'A, B, ...'} in order")
        if self.answer not in self.options:
            raise ValueError(f"seed {self.id}: answer {self.answer!r} is not an option")
        return self


class McqSeedFile(StrictModel):
    schema_: str = Field(alias="schema")
    seeds: list[McqSeed]


def load_mcq_seeds(path: str | os.PathLike = "mcq_seeds.yaml") -> list[McqSeed]:
    """MCQ seeds from YAML (`schema: mcq_seeds/1`) or JSONL (one seed object per line)."""
    raw = read_seed_file(path)
    if isinstance(raw, list):
        raw = {"schema": "mcq_seeds/1", "seeds": raw}
    seeds = _validate(McqSeedFile, raw, path, "mcq_seeds/1").seeds
    if len({s.id for s in seeds}) != len(seeds):
        raise ContractError(path, "seed ids must be unique", field="seeds")
    return seeds
