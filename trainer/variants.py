"""The Phase-2 recipes of Puro §3.4 as run configs (behaviour 29).

All four start from the same Phase-1 checkpoint (weights and optimizer state; the data restarts at
the Phase-2 shard set) with the same model, optimizer, batch and checkpoint policy, and differ only
in the three things the paper varies:

| variant | stream order | LR tail                                                  | averaging |
|---------|--------------|----------------------------------------------------------|-----------|
| UD      | uniform      | linear decay from the Phase-1 terminal rate              | none      |
| CD      | curriculum   | the same decay                                           | none      |
| CDC     | curriculum   | the decay up to resume_step, then constant at its value  | none      |
| CMA     | curriculum   | as CDC                                                   | last n    |

A CDC/CMA run follows CD's decay horizon (`schedule.horizon_steps`) and freezes the rate at
schedule(resume_step) (`schedule.hold_from_step`), continuing `continue_steps` past it.
"""

from __future__ import annotations

import copy
from typing import Any

from trainer.config import RunConfig, load_run_config

VARIANTS = ("UD", "CD", "CDC", "CMA")


def phase2_config(variant: str, *, base: dict[str, Any], phase1_checkpoint: str, phase1_step: int,
                  uniform: str, curriculum: str, run_dir: str, decay_steps: int,
                  resume_step: int | None = None, continue_steps: int = 0, average_n: int = 6,
                  average_spacing: int = 100, load_optimizer: bool = True) -> RunConfig:
    """The run config of one Phase-2 variant.

    base: the shared settings (model, optim, train.global_batch/micro_batch, checkpoint, eval,
    data.eval/tokenizer, and the decay `schedule`, e.g. {kind: linear, lr_start: init, lr_end: 0}).
    decay_steps: CD's Phase-2 length; resume_step: steps after the Phase-1 checkpoint at which
    CDC/CMA freeze the rate; continue_steps: how far they run past it.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; variants: {', '.join(VARIANTS)}")
    cfg = copy.deepcopy(base)
    cfg["run_dir"] = run_dir
    cfg.setdefault("data", {})["train"] = uniform if variant == "UD" else curriculum
    cfg["init_from"] = {"path": phase1_checkpoint, "load_optimizer": load_optimizer, "continue_data": False}
    cfg.setdefault("train", {})["steps"] = decay_steps
    cfg.setdefault("notes", {})["variant"] = variant
    if variant in ("CDC", "CMA"):
        if resume_step is None or not 0 < resume_step <= decay_steps:
            raise ValueError(f"{variant} needs 0 < resume_step <= decay_steps ({decay_steps}), got {resume_step}")
        sched = cfg.setdefault("schedule", {})
        sched["horizon_steps"] = decay_steps
        sched["hold_from_step"] = phase1_step + resume_step
        cfg["train"]["steps"] = resume_step + continue_steps
    if variant == "CMA":
        window = (average_n - 1) * average_spacing
        if window > continue_steps:
            raise ValueError(f"CMA averages {average_n} checkpoints {average_spacing} steps apart ({window} steps back "
                             f"from the end), but only the last continue_steps ({continue_steps}) run at the held "
                             f"rate: the window would reach back into the decay (before resume_step {resume_step})")
        cfg["average"] = {"n": average_n, "spacing": average_spacing}
    return load_run_config(None, data=cfg)


def phase2_configs(**kwargs) -> dict[str, RunConfig]:
    """All four variants; `run_dir` is a parent directory (one subdirectory per variant)."""
    parent = kwargs.pop("run_dir")
    return {v: phase2_config(v, run_dir=f"{parent}/{v.lower()}", **kwargs) for v in VARIANTS}
