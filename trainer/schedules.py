"""Learning-rate schedules as pure functions of the step (Puro §2.1, §3.3.2, §3.4, §3.5).

Conventions: `step` counts optimizer updates already done, so update number k (0-based) uses
lr(k). All schedules give the *base* rate; the matrix optimizer runs at m x base.

- `warmup`:    linear warmup, lr = peak (s+1)/warmup for s < warmup.
- `constant`:  warmup, then the peak.
- `wsd`:       warmup, stable, then a linear decay over the last `decay_ratio` of the post-warmup
               steps, reaching `lr_min` at the final step (ratio 1.0 = pure linear decay).
- `cosine`:    warmup, then cosine from peak to `lr_min` at the final step (Puro SFT: 1e-5 -> 1e-7).
- `power`:     Shen et al. 2024 (arXiv 2408.13359): lr(n) = min(lr_max, beta a n^b) with n the tokens
               seen and beta the batch size in sequences, after a linear warmup to lr(n_warmup);
               open-ended (Puro phase 1) or with an optional final decay.
- `linear`:    phase-2 decay: starts at the phase-1 terminal value at the run's first step (no jump)
               and falls linearly to `lr_end` at the final step.
- `hold`:      the CMA continuation as its own run: the rate frozen at a value (`init`: the value
               the init_from checkpoint's schedule had at its step).

Any schedule but `hold` also takes a tail: `hold_from_step: S` freezes it at schedule(S) from the
absolute step S on (CDC/CMA as one run: follow the decay, then continue at the resume-point rate),
and `horizon_steps` sets the schedule's own length when the run is longer or shorter than it (the
CD decay horizon of a CDC run that continues past its resume step).

`lr_start: init` / `lr: init` resolve from the `init_from` checkpoint (its recorded next-step base
rate, which is schedule(resume_step)); `resolve_schedule` fills the number in before training.
"""

from __future__ import annotations

import math
from typing import Annotated, Callable, Literal, Union

from pydantic import Field

from purokit.config import StrictModel


class _Sched(StrictModel):
    warmup_steps: int = 0
    hold_from_step: int | None = None     # absolute step S: lr(s >= S) = lr(S)  (CMA continuation)
    horizon_steps: int | None = None      # the schedule's length from the run's start (default: the run's)
    extend: bool = False                  # a resumed run may end elsewhere than planned (re-shapes the schedule)


class ConstantSchedule(_Sched):
    kind: Literal["constant"] = "constant"
    lr: float


class WSDSchedule(_Sched):
    kind: Literal["wsd"] = "wsd"
    lr: float
    decay_ratio: float = Field(0.2, ge=0.0, le=1.0)
    lr_min: float = 0.0


class CosineSchedule(_Sched):
    kind: Literal["cosine"] = "cosine"
    lr: float
    lr_min: float = 0.0


class PowerSchedule(_Sched):
    kind: Literal["power"] = "power"
    a: float = 4.0
    b: float = -0.51
    lr_max: float = 0.02
    batch_size: float = 1.0          # beta in Shen et al.; 1 if `a` already includes it
    decay_steps: int = 0              # 0: open-ended (Puro phase 1)
    lr_min: float = 0.0


class LinearSchedule(_Sched):
    kind: Literal["linear"] = "linear"
    lr_start: float | Literal["init"] = "init"
    lr_end: float = 0.0


class HoldSchedule(StrictModel):
    kind: Literal["hold"] = "hold"
    lr: float | Literal["init"] = "init"
    extend: bool = False


ScheduleConfig = Annotated[
    Union[ConstantSchedule, WSDSchedule, CosineSchedule, PowerSchedule, LinearSchedule, HoldSchedule],
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------

def warmup(step: int, warmup_steps: int, peak: float) -> float:
    """Linear warmup: peak (s+1)/W for s < W, else peak."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak


def line(step: int, s0: int, lr0: float, s1: int, lr1: float) -> float:
    """The straight line through (s0, lr0) and (s1, lr1), clamped to its ends."""
    if s1 <= s0:
        return lr1 if step >= s1 else lr0
    t = min(max((step - s0) / (s1 - s0), 0.0), 1.0)
    return lr0 + (lr1 - lr0) * t


def wsd(step: int, total_steps: int, lr: float, warmup_steps: int = 0, decay_ratio: float = 0.2,
        lr_min: float = 0.0) -> float:
    """Warmup-stable-decay (Puro §3.3.2): the last round(r (T - W)) steps decay linearly, the last
    step at lr_min; r = 1 is pure linear decay after warmup."""
    if step < warmup_steps:
        return warmup(step, warmup_steps, lr)
    n_decay = round(decay_ratio * (total_steps - warmup_steps))
    if n_decay <= 0:
        return lr
    decay_start = total_steps - n_decay          # first step below the peak
    return line(step, decay_start - 1, lr, total_steps - 1, lr_min)


def cosine(step: int, total_steps: int, lr: float, warmup_steps: int = 0, lr_min: float = 0.0) -> float:
    """Cosine from lr (first post-warmup step) to lr_min (final step)."""
    if step < warmup_steps:
        return warmup(step, warmup_steps, lr)
    span = max(total_steps - 1 - warmup_steps, 1)
    t = min(max((step - warmup_steps) / span, 0.0), 1.0)
    return lr_min + (lr - lr_min) * 0.5 * (1 + math.cos(math.pi * t))


def power_lr(n_tokens: float, a: float, b: float, lr_max: float, batch_size: float = 1.0) -> float:
    """Shen et al. 2024: min(lr_max, beta a n^b). n = 0 gives lr_max."""
    if n_tokens <= 0:
        return lr_max
    return min(lr_max, batch_size * a * n_tokens ** b)


def power(step: int, tokens_per_step: int, a: float = 4.0, b: float = -0.51, lr_max: float = 0.02,
          batch_size: float = 1.0, warmup_steps: int = 0, total_steps: int | None = None,
          decay_steps: int = 0, lr_min: float = 0.0) -> float:
    """The power schedule in tokens seen n = step x tokens_per_step. Warmup rises linearly to
    lr(n_warmup); with decay_steps > 0 (needs total_steps) the last steps fall linearly to lr_min
    from the rate where the decay starts."""
    if step < warmup_steps:
        return warmup(step, warmup_steps, power_lr(warmup_steps * tokens_per_step, a, b, lr_max, batch_size))
    if decay_steps > 0 and total_steps is not None and step >= total_steps - decay_steps:
        start = total_steps - decay_steps
        lr_start = power_lr(start * tokens_per_step, a, b, lr_max, batch_size)
        return line(step, start - 1, lr_start, total_steps - 1, lr_min)
    return power_lr(step * tokens_per_step, a, b, lr_max, batch_size)


def phase2_linear(step: int, start_step: int, total_steps: int, lr_start: float, lr_end: float = 0.0,
                  warmup_steps: int = 0) -> float:
    """Phase-2 decay (Puro §3.4): the first phase-2 step runs at lr_start, the phase-1 terminal
    value, so the rate does not jump; it falls linearly to lr_end at the final step."""
    if step - start_step < warmup_steps:
        return warmup(step - start_step, warmup_steps, lr_start)
    return line(step, start_step + warmup_steps, lr_start, total_steps - 1, lr_end)


def hold(step: int, lr: float) -> float:
    """CMA continuation (Puro §3.4): constant at the resume-point value."""
    return lr


def cma_continuation(schedule: Callable[[int], float], resume_step: int) -> Callable[[int], float]:
    """The continuation of `schedule` from resume_step: lr(s) = schedule(resume_step) for all s."""
    value = schedule(resume_step)
    return lambda step: hold(step, value)


# --------------------------------------------------------------------------------------------
# Config -> function
# --------------------------------------------------------------------------------------------

def lr_at(cfg, step: int, *, total_steps: int, tokens_per_step: int, start_step: int = 0) -> float:
    """The base learning rate of update `step` for a resolved schedule config.

    total_steps is the absolute step at which the run ends; start_step the run's first step
    (non-zero when it continues another run's checkpoint). Warmups count from start_step."""
    if isinstance(cfg, _Sched):
        if cfg.horizon_steps is not None:
            total_steps = start_step + cfg.horizon_steps
        if cfg.hold_from_step is not None and step > cfg.hold_from_step:
            step = cfg.hold_from_step
    rel, rel_total = step - start_step, total_steps - start_step
    if isinstance(cfg, ConstantSchedule):
        return warmup(rel, cfg.warmup_steps, cfg.lr)
    if isinstance(cfg, WSDSchedule):
        return wsd(rel, rel_total, cfg.lr, cfg.warmup_steps, cfg.decay_ratio, cfg.lr_min)
    if isinstance(cfg, CosineSchedule):
        return cosine(rel, rel_total, cfg.lr, cfg.warmup_steps, cfg.lr_min)
    if isinstance(cfg, PowerSchedule):
        # tokens seen count from the start of training (absolute step), as Shen et al. define n
        if step < start_step + cfg.warmup_steps:
            return warmup(rel, cfg.warmup_steps,
                          power_lr((start_step + cfg.warmup_steps) * tokens_per_step, cfg.a, cfg.b, cfg.lr_max,
                                   cfg.batch_size))
        return power(step, tokens_per_step, cfg.a, cfg.b, cfg.lr_max, cfg.batch_size, 0, total_steps,
                     cfg.decay_steps, cfg.lr_min)
    if isinstance(cfg, LinearSchedule):
        if cfg.lr_start == "init":
            raise ValueError("schedule.lr_start is 'init' but was not resolved from an init_from checkpoint")
        return phase2_linear(step, start_step, total_steps, cfg.lr_start, cfg.lr_end, cfg.warmup_steps)
    if isinstance(cfg, HoldSchedule):
        if cfg.lr == "init":
            raise ValueError("schedule.lr is 'init' but was not resolved from an init_from checkpoint")
        return hold(step, cfg.lr)
    raise TypeError(f"unknown schedule config {cfg!r}")


def resolve_schedule(cfg, init_next_lr_base: float | None):
    """Fill `init` values from the init checkpoint's recorded next-step base rate."""
    if isinstance(cfg, LinearSchedule) and cfg.lr_start == "init":
        if init_next_lr_base is None:
            raise ValueError("schedule kind 'linear' with lr_start: init needs init_from (a checkpoint to continue)")
        return cfg.model_copy(update={"lr_start": init_next_lr_base})
    if isinstance(cfg, HoldSchedule) and cfg.lr == "init":
        if init_next_lr_base is None:
            raise ValueError("schedule kind 'hold' with lr: init needs init_from (the checkpoint at resume_step)")
        return cfg.model_copy(update={"lr": init_next_lr_base})
    return cfg


def schedule_curve(cfg, total_steps: int, tokens_per_step: int, start_step: int = 0) -> list[float]:
    return [lr_at(cfg, s, total_steps=total_steps, tokens_per_step=tokens_per_step, start_step=start_step)
            for s in range(start_step, total_steps)]
