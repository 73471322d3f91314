"""Plots: learning-rate schedules (`python -m trainer schedule`) and runs' LR/loss curves."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.schedules import HoldSchedule, LinearSchedule, cma_continuation, cosine, lr_at, phase2_linear, power, wsd


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def gallery_curves(steps: int, tokens_per_step: int) -> dict[str, list[float]]:
    """Each schedule kind with illustrative parameters over `steps` (Puro-like magnitudes)."""
    w = max(steps // 50, 1)
    p1 = steps // 2
    power_fn = lambda s: power(s, tokens_per_step, a=4.0, b=-0.51, lr_max=5e-3, batch_size=1536, warmup_steps=w)  # noqa: E731
    phase1_end = power_fn(p1)
    resume = p1 + int(0.8 * (steps - p1))
    cd = lambda s: phase2_linear(s, p1, steps, phase1_end, 0.0)  # noqa: E731
    hold = cma_continuation(cd, resume)
    return {
        "wsd r=0.2": [wsd(s, steps, 5e-3, w, 0.2) for s in range(steps)],
        "wsd r=1.0 (linear)": [wsd(s, steps, 5e-3, w, 1.0) for s in range(steps)],
        "cosine": [cosine(s, steps, 5e-3, w, 5e-5) for s in range(steps)],
        "power (phase 1)": [power_fn(s) for s in range(p1 + 1)],
        "phase-2 linear from phase-1 end": [float("nan")] * p1 + [cd(s) for s in range(p1, steps)],
        "CMA hold at resume step": [float("nan")] * resume + [hold(s) for s in range(resume, steps)],
    }


def plot_schedules(out: str | os.PathLike, config: str | None = None, overrides: list[str] | None = None,
                   steps: int = 1000, tokens_per_step: int = 6_291_456) -> dict[str, Any]:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if config:
        from trainer.config import load_run_config
        cfg = load_run_config(config, overrides)
        sched = cfg.schedule
        if isinstance(sched, (LinearSchedule, HoldSchedule)) and ("init" in (getattr(sched, "lr_start", None), getattr(sched, "lr", None))):
            raise ValueError("this schedule takes its start from init_from; plot the training run's metrics instead")
        seq_len = cfg.data.synthetic.seq_len if cfg.data.synthetic else 1
        tps = cfg.train.global_batch * seq_len
        base = [lr_at(sched, s, total_steps=cfg.train.steps, tokens_per_step=tps) for s in range(cfg.train.steps)]
        ax.plot(base, label="base (AdamW groups)")
        if cfg.optim.matrix != "adamw":
            ax.plot([x * cfg.optim.matrix_lr_mult for x in base], label=f"{cfg.optim.matrix} groups (x{cfg.optim.matrix_lr_mult:g})")
        ax.set_title(f"{sched.kind} schedule of {config}")
        curves = {"base": base}
    else:
        curves = gallery_curves(steps, tokens_per_step)
        for name, ys in curves.items():
            ax.plot(ys, label=name)
        ax.set_title("Learning-rate schedules (base rate)")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return {"out": str(out), "curves": {k: {"first": v[0], "last": v[-1], "n": len(v)} for k, v in curves.items()}}


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(train records, eval records) of a metrics.jsonl."""
    train, evals = [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        (evals if rec.get("kind") == "eval" else train).append(rec)
    return train, evals


def plot_runs(runs: dict[str, str | os.PathLike], out: str | os.PathLike, title: str = "") -> str:
    """Learning rate (top) and training/held-out loss (bottom) of several runs on shared axes."""
    plt = _plt()
    fig, (ax_lr, ax_loss) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for i, (name, path) in enumerate(runs.items()):
        train, evals = read_metrics(path)
        color = f"C{i}"
        ax_lr.plot([r["step"] for r in train], [r["lr_base"] for r in train], color=color, label=name)
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], color=color, alpha=0.5, label=f"{name} train")
        own = [r for r in evals if r.get("model") != "average"]
        avg = [r for r in evals if r.get("model") == "average"]
        if own:
            ax_loss.plot([r["step"] for r in own], [r["eval_loss"] for r in own], "o-", color=color,
                         label=f"{name} held-out")
        if avg:
            ax_loss.plot([r["step"] for r in avg], [r["eval_loss"] for r in avg], "*", color=color, markersize=14,
                         label=f"{name} average of checkpoints, held-out")
    ax_lr.set_ylabel("base learning rate")
    ax_loss.set_ylabel("loss")
    ax_loss.set_xlabel("step")
    ax_lr.legend(fontsize=8)
    ax_loss.legend(fontsize=8)
    if title:
        ax_lr.set_title(title)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return str(out)
