"""Checkpoint averaging: the CMA model (Puro §3.4, behaviour 28).

The released Puro model is the equal-weight average of the last six checkpoints of the constant-LR
continuation, neighbours 100 optimizer steps apart (~0.63B tokens), stored in BF16. The sum is taken
in float64, so averaging identical checkpoints returns them unchanged (in the output dtype).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from purokit import storage
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from trainer import checkpoint as ckpt


def select_for_average(steps: list[int], n: int = 6, spacing: int = 100) -> list[int]:
    """The newest step s and s - spacing, ..., s - (n-1) spacing; all must exist.

    spacing 0 takes the newest n checkpoints whatever their steps."""
    if n < 1:
        raise ValueError("n must be >= 1")
    steps = sorted(set(steps))
    if not steps:
        raise ValueError("no checkpoints to average")
    if spacing == 0:
        if len(steps) < n:
            raise ValueError(f"asked for {n} checkpoints, found {len(steps)}: {steps}")
        return steps[-n:]
    newest = steps[-1]
    want = [newest - i * spacing for i in range(n)][::-1]
    missing = [s for s in want if s not in steps]
    if missing:
        raise ValueError(f"averaging {n} checkpoints spaced {spacing} steps ending at {newest} needs steps "
                         f"{want}; missing {missing} (have {steps}). Keep them with checkpoint.keep_every={spacing} "
                         f"or pass --spacing 0.")
    return want


def weighted_average(states: Sequence[dict[str, torch.Tensor]], coefficients: Sequence[float] | None = None,
                     dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Σ c_i θ_i per tensor over state dicts with identical keys and shapes, accumulated in float64.

    The one averaging routine: `coefficients=None` is the equal-weight mean (summed, then divided
    by n, so averaging identical checkpoints returns them unchanged); proxy_eval's merge tracking
    passes its decay-shaped coefficients."""
    if not states:
        raise ValueError("nothing to average")
    if coefficients is not None and len(coefficients) != len(states):
        raise ValueError(f"{len(states)} checkpoints but {len(coefficients)} coefficients")
    keys = list(states[0])
    for i, s in enumerate(states[1:], 1):
        if list(s) != keys:
            raise ValueError(f"checkpoint {i} has different tensors: {sorted(set(s) ^ set(keys))[:5]}")
    out = {}
    for k in keys:
        acc = torch.zeros(states[0][k].shape, dtype=torch.float64)
        for i, s in enumerate(states):
            if s[k].shape != acc.shape:
                raise ValueError(f"tensor {k}: shapes {tuple(s[k].shape)} and {tuple(acc.shape)} differ")
            acc += s[k].to(torch.float64) if coefficients is None else float(coefficients[i]) * s[k].to(torch.float64)
        out[k] = (acc / len(states) if coefficients is None else acc).to(dtype)
    return out


def average_state_dicts(states: list[dict[str, torch.Tensor]], dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Equal-weight mean of state dicts with identical keys and shapes; float64 accumulation."""
    return weighted_average(states, None, dtype)


def average_checkpoints(sources: list[str | os.PathLike], out: str | os.PathLike,
                        dtype: torch.dtype = torch.bfloat16) -> Path:
    """Average the given checkpoint directories into `out` (a checkpoint of kind `average`)."""
    dirs = [storage.path(s) for s in sources]
    states = [ckpt.read_state(d) for d in dirs]
    models = {tuple(sorted(s.model.items())) for s in states}
    if len(models) != 1:
        raise ContractError(dirs[0], "checkpoints to average have different model configs")
    weights = [ckpt.load_weights(d) for d in dirs]
    avg = average_state_dicts(weights, dtype)
    newest = max(states, key=lambda s: s.step)
    state = ckpt.CheckpointState(
        kind="average", step=newest.step, tokens_seen=newest.tokens_seen, run_start_step=newest.run_start_step,
        data_cursor=newest.data_cursor, schedule=newest.schedule, config=newest.config, model=newest.model,
        sources=[{"path": str(d), "step": s.step, "weights_sha256": sha256_file(storage.local_copy(d) / ckpt.WEIGHTS)}
                 for d, s in zip(dirs, states)])
    return ckpt.save_checkpoint(out, avg, None, state)


def average_last(checkpoints_root: str | os.PathLike, out: str | os.PathLike, n: int = 6, spacing: int = 100,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """CMA: average the last n checkpoints (spaced `spacing` steps) found under a checkpoints dir or run dir."""
    root = storage.path(checkpoints_root)
    if not ckpt.list_checkpoints(root) and ckpt.list_checkpoints(root / "checkpoints"):
        root = root / "checkpoints"
    found = dict(ckpt.list_checkpoints(root))
    chosen = select_for_average(list(found), n, spacing)
    return average_checkpoints([found[s] for s in chosen], out, dtype)
