"""The typed run config of `python -m trainer train` (YAML + `key.sub=value` overrides).

Layering: a preset (`extends: <name>` for a file in trainer/presets/, or a path) < the run file <
command-line overrides. Every field is recorded in each checkpoint's state.json.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from purokit.config import StrictModel, apply_overrides, deep_merge, load_yaml, validate
from purokit.errors import ContractError
from trainer.fp8.recipe import Fp8Recipe
from trainer.model import PRESETS, ModelConfig, preset_config
from trainer.optim import OptimConfig
from trainer.parallel import AC_MODES
from trainer.schedules import ConstantSchedule, ScheduleConfig

PRESET_DIR = Path(__file__).resolve().parent / "presets"


class ModelSection(StrictModel):
    preset: str = "tiny"
    overrides: dict[str, Any] = Field(default_factory=dict)   # any ModelConfig field; vocab_size comes from data
    vocab_multiple: int | None = Field(None, gt=0)   # pad the data's vocabulary up to a multiple (e.g. 128)

    @model_validator(mode="after")
    def _check(self) -> "ModelSection":
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; presets: {', '.join(PRESETS)}")
        unknown = set(self.overrides) - set(ModelConfig.model_fields)
        if unknown:
            raise ValueError(f"unknown model fields {sorted(unknown)}; fields: {', '.join(ModelConfig.model_fields)}")
        return self

    def build(self, vocab_size: int | None, seq_len: int | None) -> ModelConfig:
        over = dict(self.overrides)
        if vocab_size is not None:
            over.setdefault("vocab_size", padded_vocab(vocab_size, self.vocab_multiple))
        cfg = preset_config(self.preset, **over)
        if seq_len is not None and cfg.max_seq_len < seq_len:
            cfg = cfg.model_copy(update={"max_seq_len": seq_len})
        return cfg


def padded_vocab(vocab_size: int, multiple: int | None) -> int:
    """The vocabulary rounded up to `multiple` (rows past the tokenizer's are never a target)."""
    return vocab_size if not multiple else -(-vocab_size // multiple) * multiple


class SyntheticData(StrictModel):
    """A learnable synthetic token stream (a seeded sparse Markov chain with EOS-separated
    documents), for benchmarks and tests that need no shards. Exactly resumable by sequence index."""
    vocab_size: int = 256
    seq_len: int = 64
    seed: int = 0
    branching: int = 4            # next-token candidates per token: entropy floor ~ log(branching)
    mean_doc_tokens: int = 48


class DataSection(StrictModel):
    train: str | None = None                  # shard-set directory (mixtures); None: synthetic
    eval: str | None = None                   # held-out shard-set directory
    synthetic: SyntheticData | None = None
    eval_synthetic_seed: int = 1_000_003      # held-out synthetic stream (when eval is None and synthetic)
    tokenizer: str | None = None              # tokenizer.json (or dir): the reader refuses shards made
                                              # with another one; export copies it
    seq_len: int | None = None                # window length (default: the shard set's)
    loop: bool = False                        # repeat the shard set when it runs out (epochs)
    document_mask: bool = False               # attention stays inside each packed document
    document_positions: bool = False          # rotary positions restart at each document
    verify_hashes: bool = False               # sha256 every shard on open

    @model_validator(mode="after")
    def _check(self) -> "DataSection":
        if self.train is None and self.synthetic is None:
            raise ValueError("data.train (a shard set) or data.synthetic is required")
        return self


class TrainSection(StrictModel):
    steps: int = Field(gt=0)                  # optimizer steps in this run (from its start step)
    global_batch: int = Field(8, gt=0)        # sequences per optimizer step, all ranks together
    micro_batch: int = Field(4, gt=0)         # sequences per forward/backward on one rank
    gc_every_steps: int = Field(50, ge=0)     # Python GC is off in the loop; a young collection every N


class CheckpointSection(StrictModel):
    every_steps: int = Field(50, ge=0)        # 0: only at the end
    keep_last: int = Field(3, ge=1)
    keep_every: int = Field(0, ge=0)          # also keep every K-th step forever (0: none)
    at_end: bool = True


class EvalSection(StrictModel):
    every_steps: int = Field(0, ge=0)         # 0: only at the end (if data.eval is set)
    sequences: int = Field(32, gt=0)          # held-out sequences per evaluation (the same ones each time)
    at_end: bool = True


class LogSection(StrictModel):
    every_steps: int = Field(1, gt=0)         # progress line frequency
    detail_every: int | None = Field(None, gt=0)   # per-layer zero-grad fractions and effective LRs
                                              # (host syncs); default: every step on CPU, every 100 on CUDA
    progress: Literal["line", "bar", "none"] = "line"
    tensorboard: bool = False


# what a Hugging Face import may knowingly drop or take as it is (trainer.hf says how)
HfAcceptable = Literal["rope_scaling", "sliding_window", "tie_word_embeddings", "nonfinite"]


class InitFrom(StrictModel):
    """Start from another run's checkpoint (phase 2 from phase 1, CDC from CD at resume_step), or
    from a Hugging Face Qwen3 directory (`hf:`, imported by `trainer.hf`). The optimizer state's
    tensors (moments, MuonH radii) come along; its settings are this config's."""
    path: str | None = None                   # checkpoint dir, or a checkpoints dir / run dir (latest)
    hf: str | None = None                     # a Hugging Face Qwen3 model directory (no optimizer state)
    accept: list[HfAcceptable] = Field(default_factory=list)   # what the hf import may knowingly drop
    load_optimizer: bool = True
    continue_data: bool = False               # keep reading the same stream from its cursor
    reset_step: bool = False                  # count steps from 0 instead of continuing the counter

    @model_validator(mode="after")
    def _check(self) -> "InitFrom":
        if self.path == "REQUIRED":
            raise ValueError("set init_from.path to the checkpoint to start from (the preset leaves it open)")
        if (self.path is None) == (self.hf is None):
            raise ValueError("init_from needs exactly one of path (a checkpoint) and hf (a Hugging Face directory)")
        return self


class AverageSection(StrictModel):
    """Build the CMA model at the end of the run: the equal-weight average of the last `n`
    checkpoints, `spacing` steps apart (Puro §3.4: six, 100 steps), written to <run_dir>/average."""
    n: int = Field(6, ge=1)
    spacing: int = Field(100, ge=1)
    dtype: Literal["bfloat16", "float32"] = "bfloat16"


class ParallelSection(StrictModel):
    """How the model is spread over ranks under torchrun, and what the backward recomputes."""
    data: Literal["ddp", "fsdp"] = "ddp"     # fsdp: FSDP2 fully_shard (trainer.parallel)
    activation_checkpointing: str = "none"    # none | selective | full (trainer.parallel)

    @model_validator(mode="after")
    def _check(self) -> "ParallelSection":
        if self.activation_checkpointing not in AC_MODES:
            raise ValueError(f"activation_checkpointing must be one of {', '.join(AC_MODES)}")
        return self


class RunConfig(StrictModel):
    schema_: str = Field("trainer-run/1", alias="schema")
    run_dir: str
    seed: int = 0
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    objective: Literal["pretrain", "sft"] = "pretrain"
    precision: Literal["auto", "fp32", "bf16", "fp8-blockwise"] = "auto"   # auto: fp32 on CPU, bf16 on CUDA
    device: str = "auto"
    compile: bool = False                     # per-block torch.compile of the model, and of the loss chunk
    deterministic: bool | None = None         # default: on for CPU (free there), off for CUDA
    fp8: Fp8Recipe | None = None              # the blockwise FP8 recipe (precision: fp8-blockwise)
    train: TrainSection
    schedule: ScheduleConfig = Field(default_factory=lambda: ConstantSchedule(lr=1e-3))
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    log: LogSection = Field(default_factory=LogSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    init_from: InitFrom | None = None
    average: AverageSection | None = None
    notes: dict[str, Any] = Field(default_factory=dict)   # free-form labels (e.g. variant: CMA)

    model_config = ConfigDict(populate_by_name=True)

    @model_validator(mode="after")
    def _check_average(self) -> "RunConfig":
        if self.fp8 is not None and self.precision != "fp8-blockwise":
            raise ValueError(f"an fp8 recipe is set but precision is {self.precision!r} (use fp8-blockwise)")
        a, c = self.average, self.checkpoint
        if a is not None:
            if c.every_steps == 0 or a.spacing % c.every_steps:
                raise ValueError(f"average.spacing ({a.spacing}) must be a multiple of checkpoint.every_steps "
                                 f"({c.every_steps}) so the averaged checkpoints exist")
            if (a.n - 1) * a.spacing >= self.train.steps:
                raise ValueError(f"averaging {a.n} checkpoints {a.spacing} steps apart needs more than "
                                 f"{(a.n - 1) * a.spacing} steps; train.steps is {self.train.steps}")
        return self

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def _resolve_extends(data: dict, origin: Path | None, seen: tuple = ()) -> dict:
    ext = data.pop("extends", None)
    if ext is None:
        return data
    path = Path(ext)
    if not path.suffix:
        path = PRESET_DIR / f"{ext}.yaml"
    elif not path.is_absolute() and origin is not None:
        path = origin.parent / path
    if path in seen:
        raise ContractError(path, "circular 'extends'")
    base = _resolve_extends(load_yaml(path), path, seen + (path,))
    return deep_merge(base, data)


def load_run_config(path: str | os.PathLike | None, overrides: list[str] | None = None,
                    data: dict | None = None) -> RunConfig:
    """Layer preset < file (or `data`) < overrides and validate; errors name the file and field."""
    origin = Path(path) if path else None
    raw = load_yaml(path) if path else dict(data or {})
    raw = _resolve_extends(raw, origin)
    raw = apply_overrides(raw, overrides or [])
    raw = _resolve_extends(raw, origin)       # an override may set `extends`
    return validate(RunConfig, raw, path or "<config>")
