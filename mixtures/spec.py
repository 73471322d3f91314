"""The mixture spec (ARCHITECTURE.md contract 3): one YAML file a person reviews and versions.

```yaml
schema: mixture/1
name: demo
tokenizer: {kind: hf, path: runs/demo/tokenizer/tokenizer.json}
seq_len: 512
bucket_count: 16                 # K, Puro §3.4 (376 in production)
seeds: {bucket_shuffle: 1, uniform: 2, replay: 3, budget: 4, holdout: 5}
holdout: {fraction: 0.02}        # optional: a fixed eval set, excluded from every phase
components:
  - name: web
    path: runs/demo/kaiyuan/components/web
    score_field: quality.edu     # or null: a seeded random order
    higher_is_better: true
    retention: {rule: top_fraction, fraction: 0.5}
    repeat: none                 # none | uniform | dup_count | log_dup_count (see ComponentSpec)
    max_copies: 4                # dup_count rules: at most this many copies of any document
    order_seed: 11
phases:
  - name: phase1
    orders: [uniform]
    components: {web: 0.7, math: 0.15, code: 0.15}      # weights (sum to 1) ...
    n_tokens: 2000000                                    # ... of this many tokens (default: as many as fit)
  - name: phase2
    orders: [curriculum, uniform]
    transition_tokens: 200000    # Puro §3.6.2: phase-1 replay fades out linearly over this window
    components: {web: 0.4, math: {weight: 0.35}, code: {n_tokens: 300000}}
```

A phase's component entry is a weight (a number or `{weight: w}`), a token budget
(`{n_tokens: N}`), or `{}` (everything retained). Weights in one phase must sum to 1 and cannot
be mixed with the other two forms. Errors name the field (`phases[1].components.math`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from purokit import storage
from purokit.component import Component
from purokit.config import StrictModel, apply_overrides, load_yaml
from purokit.document import QUALITY_PREFIX
from purokit.errors import ContractError
from purokit.hashing import config_hash
from mixtures.tokenizers import TokenizerSpec

MIXTURE_SCHEMA = "mixture/1"
WEIGHT_TOLERANCE = 1e-6


class MixtureSpecError(ContractError):
    """A mixture spec is invalid; the message names the field and what to change."""


class _FieldError(ValueError):
    """A validation error that knows its field path (relative to the model that raised it)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def _field_error(field: str, message: str) -> _FieldError:
    return _FieldError(field, message)


# ---- retention rules ----------------------------------------------------------------------------

class RetainAll(StrictModel):
    rule: Literal["all"] = "all"


class RetainThreshold(StrictModel):
    """Keep documents whose score is at least as preferred as `threshold` (>= for
    higher-is-better scores, <= otherwise). Documents without a score are dropped (counted)."""

    rule: Literal["threshold"]
    threshold: float


class RetainTopFraction(StrictModel):
    """Keep the most preferred `fraction` of the component's tokens (Puro §3.6.1: DCLM-Dedup
    keeps ~the top 5%), i.e. documents with within-component rank r >= 1 - fraction."""

    rule: Literal["top_fraction"]
    fraction: float = Field(gt=0, le=1)


class RetainQuantileBand(StrictModel):
    """Keep documents with within-component rank r in [low, high): rank 0 is the least preferred
    end, so {low: 0.75, high: 1.0} is the best quarter by token mass."""

    rule: Literal["quantile_band"]
    low: float = Field(ge=0, lt=1)
    high: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> "RetainQuantileBand":
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class RetainRandomTokens(StrictModel):
    """A seeded random subset of about `n_tokens` tokens (documents are taken in a seeded random
    order while their first token falls below the budget)."""

    rule: Literal["random_tokens"]
    n_tokens: int = Field(gt=0)
    seed: int = 0


class RetainIds(StrictModel):
    """Keep exactly the listed document ids (inline, or one per line in `ids_file`): proxy slices
    chosen elsewhere (proxy_eval) become shard sets this way."""

    rule: Literal["ids"]
    ids: list[str] | None = None
    ids_file: str | None = None

    @model_validator(mode="after")
    def _one(self) -> "RetainIds":
        if (self.ids is None) == (self.ids_file is None):
            raise ValueError("give ids or ids_file (one of them)")
        return self

    def id_set(self) -> set[str]:
        if self.ids is not None:
            return set(self.ids)
        return {line.strip() for line in Path(self.ids_file).read_text(encoding="utf-8").splitlines() if line.strip()}


Retention = Annotated[Union[RetainAll, RetainThreshold, RetainTopFraction, RetainQuantileBand, RetainRandomTokens,
                            RetainIds],
                      Field(discriminator="rule")]


# ---- components, phases, spec -------------------------------------------------------------------

class ComponentSpec(StrictModel):
    """One component of the mixture. `repeat` says how it reaches a budget above its retained tokens:

    - `none`: it may not (a budget above the retained tokens is an error);
    - `uniform`: whole passes over every retained document, the last pass a seeded subset;
    - `dup_count`: document d may appear up to min(dup_count(d), max_copies) times (kaiyuan dedup's
      cluster size: text that was duplicated in the raw data is repeated, but a boilerplate
      template with dup_count 5,000 takes at most `max_copies`, so repetition cannot undo dedup);
    - `log_dup_count`: up to min(1 + floor(log2 dup_count(d)), max_copies) times (2-3 -> 2, 4-7 -> 3).

    With the dup_count rules the extra copies come in passes: pass c (c >= 1) holds copy c of every
    document allowed more than c copies, passes are taken in order and the last one is cut in the
    seeded budget order; a budget above what the caps allow is an error that names the supply.
    """

    name: str = Field(min_length=1)
    path: str
    score_field: str | None = None
    higher_is_better: bool = True
    retention: Retention = Field(default_factory=RetainAll)
    repeat: Literal["none", "uniform", "dup_count", "log_dup_count"] = "none"
    max_copies: int = Field(default=4, ge=1)
    order_seed: int = 0

    @property
    def dup_weighted(self) -> bool:
        """Whether repetition follows the dedup cluster sizes (needs a dup_count column)."""
        return self.repeat in ("dup_count", "log_dup_count")

    @field_validator("score_field")
    @classmethod
    def _column(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return v if v.startswith(QUALITY_PREFIX) or v in ("lang_score",) else QUALITY_PREFIX + v

    @model_validator(mode="after")
    def _rule_needs_score(self) -> "ComponentSpec":
        if self.retention.rule in ("threshold", "top_fraction", "quantile_band") and self.score_field is None:
            raise ValueError(f"retention rule '{self.retention.rule}' needs a score_field")
        return self


class PhaseShare(StrictModel):
    weight: float | None = Field(default=None, ge=0, le=1)
    n_tokens: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> "PhaseShare":
        if self.weight is not None and self.n_tokens is not None:
            raise ValueError("give a weight or n_tokens, not both")
        return self


class PhaseSpec(StrictModel):
    name: str = Field(min_length=1)
    components: dict[str, PhaseShare]
    n_tokens: int | None = Field(default=None, gt=0)
    orders: list[Literal["curriculum", "uniform"]] = Field(default_factory=lambda: ["uniform"], min_length=1)
    bucket_count: int | None = Field(default=None, ge=1)
    transition_tokens: int = Field(default=0, ge=0)

    @field_validator("components", mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: ({"weight": x} if isinstance(x, (int, float)) and not isinstance(x, bool)
                        else ({} if x is None else x)) for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _shares(self) -> "PhaseSpec":
        if not self.components:
            raise ValueError("a phase needs at least one component")
        weights = {k: s.weight for k, s in self.components.items() if s.weight is not None}
        if weights and len(weights) != len(self.components):
            others = sorted(set(self.components) - set(weights))
            raise _FieldError("components", f"mixes weights with budgets/'all' ({', '.join(others)}); use one form per phase")
        if weights:
            total = sum(weights.values())
            if abs(total - 1.0) > WEIGHT_TOLERANCE:
                raise _FieldError("components", f"weights sum to {total:.6g}, not 1 ({', '.join(f'{k}={w:g}' for k, w in weights.items())})")
        elif self.n_tokens is not None:
            raise _FieldError("n_tokens", "n_tokens (the phase total) needs weights; with budgets the total is their sum")
        return self

    @property
    def weighted(self) -> bool:
        return any(s.weight is not None for s in self.components.values())


class Seeds(StrictModel):
    bucket_shuffle: int = 0      # order inside each curriculum bucket
    uniform: int = 0             # the global shuffle of the uniform stream
    replay: int = 0              # which phase-1 documents the transition replays
    budget: int = 0              # which documents a weight/budget below the retained tokens keeps
    holdout: int = 0             # which documents form the eval set


class Holdout(StrictModel):
    """A fixed held-out eval set: each document of every component is held out when its seeded
    hash falls below `fraction`; held-out documents appear in no phase."""

    fraction: float = Field(gt=0, lt=1)
    max_tokens: int | None = Field(default=None, gt=0)


class MixtureSpec(StrictModel):
    model_config = ConfigDict(populate_by_name=True)
    schema_: Literal["mixture/1"] = Field(default=MIXTURE_SCHEMA, alias="schema")
    name: str = Field(min_length=1)
    tokenizer: TokenizerSpec
    seq_len: int = Field(gt=0)
    bucket_count: int = Field(default=1, ge=1)
    seeds: Seeds = Field(default_factory=Seeds)
    holdout: Holdout | None = None
    shard_tokens: int = Field(default=1 << 30, gt=0)   # largest shard file, in tokens
    components: list[ComponentSpec] = Field(min_length=1)
    phases: list[PhaseSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> "MixtureSpec":
        seen: set[str] = set()
        for i, c in enumerate(self.components):
            if c.name in seen:
                raise _field_error(f"components[{i}].name", f"duplicate component name '{c.name}'")
            seen.add(c.name)
        pseen: set[str] = set()
        for i, p in enumerate(self.phases):
            if p.name in pseen:
                raise _field_error(f"phases[{i}].name", f"duplicate phase name '{p.name}'")
            pseen.add(p.name)
            for cname in p.components:
                if cname not in seen:
                    raise _field_error(f"phases[{i}].components.{cname}",
                                       f"unknown component (known: {', '.join(sorted(seen))})")
            if p.transition_tokens and i == 0:
                raise _field_error(f"phases[{i}].transition_tokens", "the first phase has no earlier phase to replay")
        return self

    # ---- helpers ----
    def component(self, name: str) -> ComponentSpec:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    def phase(self, name: str) -> PhaseSpec:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase '{name}' (phases: {', '.join(p.name for p in self.phases)})")

    def bucket_count_of(self, phase: PhaseSpec) -> int:
        return phase.bucket_count or self.bucket_count

    def spec_hash(self) -> str:
        return config_hash(self.model_dump(mode="json", by_alias=True))

    def to_yaml_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def parse_spec(data: dict[str, Any], source: str | os.PathLike = "<spec>", base_dir: Path | None = None) -> MixtureSpec:
    """Validate a spec dict; relative component and tokenizer paths resolve against `base_dir`."""
    try:
        spec = MixtureSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-after", "tagged-union"))]
        field = _format_loc(loc)
        cause = err.get("ctx", {}).get("error")
        if isinstance(cause, _FieldError):
            full = ".".join(x for x in (field, cause.field) if x)
            raise MixtureSpecError(source, str(cause), field=full) from None
        msg = err["msg"].removeprefix("Value error, ")
        raise MixtureSpecError(source, f"{msg} (input: {err.get('input')!r:.80})", field=field or None) from None
    if base_dir is not None:
        for c in spec.components:
            if not storage.is_remote(c.path) and not Path(c.path).is_absolute():
                c.path = str((base_dir / c.path).resolve())
        if spec.tokenizer.path and spec.tokenizer.kind != "qwen3" and not Path(spec.tokenizer.path).is_absolute():
            cand = (base_dir / spec.tokenizer.path)
            if cand.exists():
                spec.tokenizer.path = str(cand.resolve())
    return spec


def _format_loc(loc: list[str]) -> str:
    out = ""
    for p in loc:
        if p.isdigit():
            out += f"[{p}]"
        else:
            out += ("." if out else "") + p
    return out


def load_spec(path: str | os.PathLike, overrides: list[str] | None = None) -> MixtureSpec:
    path = Path(path)
    data = apply_overrides(load_yaml(path), overrides or [])
    return parse_spec(data, path, base_dir=path.parent)


def check_components(spec: MixtureSpec, source: str | os.PathLike = "<spec>") -> dict[str, Component]:
    """Checks that need the components on disk (still before any work): each path is a valid
    component and has the score field the spec names. Returns the opened components."""
    opened: dict[str, Component] = {}
    for i, c in enumerate(spec.components):
        try:
            comp = Component.open(c.path)
        except ContractError as e:
            raise MixtureSpecError(source, f"component '{c.name}': {e}", field=f"components[{i}].path") from None
        if c.score_field is not None and c.score_field not in comp.manifest.columns:
            raise MixtureSpecError(
                source, f"component '{c.name}' uses score field '{c.score_field}', but {c.path}/manifest.json has "
                f"no such column (columns: {', '.join(comp.columns)})", field=f"components[{i}].score_field")
        if c.dup_weighted and "dup_count" not in comp.manifest.columns:
            raise MixtureSpecError(source, f"component '{c.name}' asks for dup_count-aware repetition but has no "
                                   "dup_count column (run kaiyuan dedup first, or use repeat: uniform)",
                                   field=f"components[{i}].repeat")
        opened[c.name] = comp
    for i, p in enumerate(spec.phases):
        problem = bucket_count_problem(spec.bucket_count_of(p), sum(opened[c].manifest.n_docs for c in p.components))
        if problem:
            field = f"phases[{i}].bucket_count" if p.bucket_count else "bucket_count"
            raise MixtureSpecError(source, f"phase '{p.name}': {problem}", field=field)
    return opened


MIN_DOCS_PER_BUCKET = 2


def bucket_count_problem(bucket_count: int, n_docs: int) -> str | None:
    """Why `bucket_count` buckets cannot be filled from `n_docs` documents, or None.

    The curriculum (Puro §3.4) cuts a phase's pool into K buckets of equal tokens; with fewer than
    `MIN_DOCS_PER_BUCKET` documents per bucket most buckets hold one document or none, and the
    order is no longer a gradient of quality (the paper's K = 376 is for ~10^9 documents)."""
    if bucket_count <= 1 or n_docs >= MIN_DOCS_PER_BUCKET * bucket_count:
        return None
    return (f"bucket_count {bucket_count} needs at least {MIN_DOCS_PER_BUCKET * bucket_count} documents "
            f"({MIN_DOCS_PER_BUCKET} per bucket), the phase's components hold {n_docs}; "
            f"use bucket_count <= {max(1, n_docs // MIN_DOCS_PER_BUCKET)}")
