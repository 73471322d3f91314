"""Where a run starts: its own newest checkpoint (resume), `init_from` (a checkpoint or a Hugging Face
model) or scratch; the checks that a continued run means what it says (the schedule's extension, the
model fields that cannot change, the checkpoints a CMA average will need); and the model config."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from purokit import storage
from purokit.log import get_logger
from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.model import ModelConfig
from trainer.schedules import lr_at, resolve_schedule

log = get_logger("trainer")
SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff")   # fixed by the weights
CHANGEABLE_FIELDS = ("rope_theta", "max_seq_len", "norm_eps")                       # a continued run may change


@dataclasses.dataclass
class StartState:
    """Where a run starts: `kind` is resume (its own checkpoint), init (init_from) or scratch."""

    kind: str
    directory: Path | None
    state: ckpt.CheckpointState | None
    start_step: int
    step: int
    tokens_seen: int
    cursor: dict | None
    schedule: Any
    total_steps: int


def resolve_start(cfg: RunConfig, ckpt_dir: Path, allow_config_change: tuple[str, ...] = ()) -> StartState:
    """Resume from the newest checkpoint of this run, else start from `init_from`, else from scratch;
    resolve the schedule (`init` values) and refuse a resume whose longer `train.steps` would re-shape
    the schedule unless `schedule.extend: true`. `allow_config_change`: config keys a resume may change
    without a warning."""
    found = ckpt.resume_point(ckpt_dir, cfg.dump(), allow_config_change)
    if found is not None:
        resume_dir, st = found
        saved = st.schedule.config if st.schedule else {}
        saved_value = saved.get("lr_start", saved.get("lr")) if saved.get("kind") == cfg.schedule.kind else None
        schedule = resolve_schedule(cfg.schedule, saved_value if isinstance(saved_value, float) else None)
        start = StartState("resume", resume_dir, st, st.run_start_step, st.step, st.tokens_seen, st.data_cursor,
                           schedule, st.run_start_step + cfg.train.steps)
        return start
    if cfg.init_from is not None:
        if cfg.init_from.path is not None:
            d = ckpt.resolve_checkpoint(cfg.init_from.path)
        else:
            from trainer.hf import import_hf
            d = import_hf(cfg.init_from.hf, storage.join(cfg.run_dir, "init_hf"),
                          vocab_multiple=cfg.model.vocab_multiple, accept=cfg.init_from.accept)
        st = ckpt.read_state(d)
        start_step = 0 if cfg.init_from.reset_step else st.step
        next_lr = st.schedule.lr_base_next if st.schedule else None
        return StartState("init", d, st, start_step, start_step, 0 if cfg.init_from.reset_step else st.tokens_seen,
                          st.data_cursor if cfg.init_from.continue_data else None,
                          resolve_schedule(cfg.schedule, next_lr), start_step + cfg.train.steps)
    return StartState("scratch", None, None, 0, 0, 0, None, resolve_schedule(cfg.schedule, None), cfg.train.steps)


def check_schedule_extension(cfg: RunConfig, start: StartState, tokens_per_step: int) -> None:
    """A resumed run whose end moved (train.steps raised or lowered) would follow a re-shaped
    schedule from its next step on: refuse unless `schedule.extend: true`, then warn."""
    if start.kind != "resume":
        return
    sched_state = start.state.schedule
    if sched_state is None or sched_state.total_steps in (0, start.total_steps) or start.step >= start.total_steps:
        return
    planned = sched_state.lr_base_next
    now = lr_at(start.schedule, start.step, total_steps=start.total_steps, tokens_per_step=tokens_per_step,
                start_step=start.start_step)
    if planned is None or math.isclose(planned, now, rel_tol=1e-9, abs_tol=1e-15):
        return
    what = (f"the run was planned for {sched_state.total_steps} steps and now ends at {start.total_steps}: "
            f"the {start.schedule.kind} schedule re-shapes, the base rate of step {start.step} goes from "
            f"{planned:.4g} to {now:.4g}")
    if not getattr(cfg.schedule, "extend", False):
        raise ValueError(f"{start.directory}: {what}; set schedule.extend: true to continue on the new schedule "
                         "(or keep train.steps)")
    log.warning("schedule.extend: %s", what)


def resolve_model_config(cfg: RunConfig, ref: ckpt.CheckpointState | None, data_vocab: int,
                         seq_len: int) -> ModelConfig:
    """The model of this run. Continuing a checkpoint, its shapes stay; a config that names the model
    and asks for other shapes is refused by field; `rope_theta`, `max_seq_len`, `norm_eps` take the
    config's values (with a warning). A checkpoint's vocabulary may be larger than the data's (padded)."""
    wanted = cfg.model.build(data_vocab, seq_len)
    if ref is None:
        if wanted.vocab_size < data_vocab:
            raise ValueError(f"model.overrides.vocab_size {wanted.vocab_size} < data vocabulary {data_vocab}: "
                             "the data's token ids would not fit the embedding")
        return wanted
    saved = ModelConfig.model_validate(ref.model)
    if saved.vocab_size < data_vocab:
        raise ValueError(f"checkpoint vocabulary {saved.vocab_size} < data vocabulary {data_vocab}: the data's "
                         "token ids do not fit the checkpoint's embedding")
    update: dict[str, Any] = {}
    if "model" in cfg.model_fields_set:
        fixed = [f"model.{f}: checkpoint {getattr(saved, f)}, config {getattr(wanted, f)}"
                 for f in SHAPE_FIELDS if getattr(saved, f) != getattr(wanted, f)]
        if fixed:
            raise ValueError("these model fields cannot change when continuing a checkpoint: " + "; ".join(fixed))
        if wanted.vocab_size != saved.vocab_size:
            log.warning("model.vocab_size: keeping the checkpoint's %d (the config gives %d)",
                        saved.vocab_size, wanted.vocab_size)
        update = {f: getattr(wanted, f) for f in CHANGEABLE_FIELDS if getattr(wanted, f) != getattr(saved, f)}
        if update:
            log.warning("continuing with the config's model fields %s (checkpoint: %s)", update,
                        {f: getattr(saved, f) for f in update})
    model_cfg = saved.model_copy(update=update)
    if model_cfg.max_seq_len < seq_len:           # RoPE tables are not weights: just make them longer
        model_cfg = model_cfg.model_copy(update={"max_seq_len": seq_len})
    return model_cfg


def average_protected_steps(cfg: RunConfig, start: StartState) -> set[int]:
    """The checkpoint steps a CMA average at the end of the run reads (pruning keeps them); refuses a run whose
    end is not a checkpoint step."""
    if cfg.average is None:
        return set()
    if start.total_steps % cfg.checkpoint.every_steps:
        raise ValueError(f"the run ends at step {start.total_steps}, not a multiple of checkpoint.every_steps "
                         f"({cfg.checkpoint.every_steps}): the checkpoints to average would not exist")
    return {start.total_steps - i * cfg.average.spacing for i in range(cfg.average.n)}
