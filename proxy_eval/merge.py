"""Merge-based evaluation tracking (Nemotron 3 §2.5, after WSM; spec seed-nemotron3.md §1.10).

During a constant-LR (stable) phase single checkpoints give noisy benchmark readings, and a real
reading would need a decay run. Instead, merge a sliding window of recent checkpoints with
coefficients that simulate a learning-rate decay, and evaluate the merge:

    window θ_0..θ_k, updates Δ_i = θ_i − θ_{i−1}, α_i = g((i − ½)/k) with g the decay shape
    merged = θ_0 + Σ_i α_i Δ_i = Σ_i c_i θ_i,  c_0 = 1 − α_1,  c_i = α_i − α_{i+1} (α_{k+1} = 0)

so Σ c_i = 1. Update i spans the fraction ((i−1)/k, i/k] of the simulated decay, so it is scaled by
the decay at its midpoint; the right end point g(i/k) (the spec's sketch) would give the newest
update weight g(1) = 0 and drop the newest checkpoint entirely (a window of one update would just
return the previous checkpoint). The paper uses g(x) = 1 − sqrt(x) (minus-sqrt), windows of 5, 10 and 20 checkpoints,
and takes the best of the windows at each point; the merge beats the raw checkpoint by 2–4 points
in the stable phase.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from proxy_eval.evaluate import evaluate_suite, load_suite
from proxy_eval.loading import load_trainer_model, open_tokenizer, trainer_checkpoint_tokenizer
from proxy_eval.models import TorchModuleScorer
from proxy_eval.profiles import build_profile
from trainer import checkpoint as ckpt
from trainer.average import weighted_average

DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "1-sqrt": lambda x: 1.0 - math.sqrt(x),          # minus-sqrt (WSM, Nemotron 3)
    "linear": lambda x: 1.0 - x,
    "cosine": lambda x: 0.5 * (1.0 + math.cos(math.pi * x)),
    "constant": lambda x: 1.0,                       # no decay: the newest checkpoint alone
}


def merge_coefficients(k: int, shape: str = "1-sqrt") -> np.ndarray:
    """c_0..c_k for a window of k+1 checkpoints (oldest first). shape 'equal' gives the plain
    average (CMA-style); the others come from α_i = g((i − ½)/k)."""
    if k < 0:
        raise ValueError("a window needs at least one checkpoint")
    if shape == "equal":
        return np.full(k + 1, 1.0 / (k + 1))
    if shape not in DECAY_SHAPES:
        raise ValueError(f"unknown decay shape {shape!r}; known: {', '.join([*DECAY_SHAPES, 'equal'])}")
    if k == 0:
        return np.ones(1)
    g = DECAY_SHAPES[shape]
    alpha = np.array([g((i - 0.5) / k) for i in range(1, k + 1)] + [0.0])     # α_1..α_k, α_{k+1} = 0
    c = np.empty(k + 1)
    c[0] = 1.0 - alpha[0]
    c[1:] = alpha[:-1] - alpha[1:]
    return c


@dataclass
class TrackPoint:
    end_step: int
    window: int                       # number of updates merged (k): k+1 checkpoints
    steps: list[int]
    coefficients: list[float]
    average: float                    # mean primary score over the suite's tasks (profile scale)
    scores: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def track_run(run_dir: str | os.PathLike, suite: Any, windows: Sequence[int] = (5, 10, 20), shape: str = "1-sqrt",
              tokenizer: Any = None, at: str = "latest", batch_size: int | None = None,
              progress: Callable[[str], None] | None = None) -> list[TrackPoint]:
    """Evaluate the raw checkpoint (window 0) and merges of the last k+1 checkpoints for each window
    k, ending at the latest checkpoint (`at='latest'`) or at every checkpoint (`at='all'`)."""
    progress = progress or (lambda m: None)
    root = Path(run_dir)
    found = ckpt.list_checkpoints(root / "checkpoints" if (root / "checkpoints").is_dir() else root)
    if not found:
        raise FileNotFoundError(f"no checkpoints under {run_dir}")
    steps = [s for s, _ in found]
    paths = dict(found)
    model, state = load_trainer_model(paths[steps[-1]])
    tok = open_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike, dict)) else tokenizer
    tok = tok or trainer_checkpoint_tokenizer(state)
    if tok is None:
        raise ValueError("no tokenizer recorded for this run; pass one")
    tasks = load_suite(suite)
    cache: dict[int, dict[str, torch.Tensor]] = {}

    def weights(step: int) -> dict[str, torch.Tensor]:
        if step not in cache:
            cache[step] = {k: v.float() for k, v in ckpt.load_weights(paths[step]).items()}
        return cache[step]

    ends = steps if at == "all" else [steps[-1]]
    points: list[TrackPoint] = []
    for end in ends:
        idx = steps.index(end)
        for k in [0, *sorted(set(windows))]:
            if idx - k < 0:
                continue
            window_steps = steps[idx - k: idx + 1]
            coeffs = merge_coefficients(k, shape) if k else np.ones(1)
            merged = weighted_average([weights(s) for s in window_steps], coeffs, dtype=torch.float32)
            model.load_state_dict(merged, strict=False)
            scorer = TorchModuleScorer(model, tok, max_length=model.cfg.max_seq_len, name=f"step{end}-w{k}")
            result = evaluate_suite(scorer, suite, tasks=tasks, batch_size=batch_size)
            prof = build_profile([{**r, "slice": scorer.name} for r in result.rows()])
            scores = {t: float(prof.scores.loc[scorer.name, t]) for t in prof.scores.columns}
            points.append(TrackPoint(end, k, window_steps, [float(c) for c in coeffs],
                                     float(prof.average[scorer.name]), scores))
            progress(f"step {end}, window {k}: average {points[-1].average:.3f}")
    return points


def best_per_point(points: Sequence[TrackPoint]) -> dict[int, TrackPoint]:
    """The best merge (window > 0) at each end step, as Nemotron 3 reports it."""
    best: dict[int, TrackPoint] = {}
    for p in points:
        if p.window == 0:
            continue
        if p.end_step not in best or p.average > best[p.end_step].average:
            best[p.end_step] = p
    return best


def write_track(out: str | os.PathLike, points: Sequence[TrackPoint], shape: str, windows: Sequence[int]) -> list[str]:
    """Write `track.json` (every point and the best merge per end step) and `track.csv` under
    `out`; the lines that tell a user how each merge did against its raw checkpoint."""
    from purokit import atomic
    from proxy_eval.contracts import TrackFile

    best = best_per_point(points)
    out = Path(out)
    TrackFile(shape=shape, windows=list(windows), points=[p.to_dict() for p in points],
              best={str(k): v.to_dict() for k, v in best.items()}).write(out / "track.json")
    tasks = sorted(points[0].scores)
    rows = ["end_step,window,average," + ",".join(tasks)]
    rows += [f"{p.end_step},{p.window},{p.average:.6g}," + ",".join(f"{p.scores[t]:.6g}" for t in tasks)
             for p in points]
    atomic.write_text(out / "track.csv", "\n".join(rows) + "\n")
    lines = [f"step {p.end_step:>7}  window {p.window:>3}  average {p.average:.4f}" for p in points]
    for step, p in sorted(best.items()):
        raw = next(q for q in points if q.end_step == step and q.window == 0)
        lines.append(f"step {step}: best merge window {p.window} ({p.average:.4f}) vs raw checkpoint ({raw.average:.4f})")
    return lines
