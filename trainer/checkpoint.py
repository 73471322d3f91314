"""The checkpoint contract (ARCHITECTURE.md contract 5): one directory per checkpoint,

    <checkpoints>/step_00000120/
        model.safetensors     weights, Hugging Face-style names (fp32 master weights; BF16 for averages)
        optimizer.pt          optimizer state (absent for averaged checkpoints)
        state.json            schema, step, tokens seen, the reader's cursor, schedule state, RNG
                              states, the run config, the model config

written atomically (temporary directory, then rename), so a killed writer never leaves a half
checkpoint that a reader could pick up. `list_checkpoints` returns only complete ones. Retention keeps
the last N plus every K-th step (`prune`).
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import load_file, save_file

from common import atomic
from common.errors import ContractError
from common.manifest import utc_now
from common.version import code_version

CHECKPOINT_SCHEMA = "trainer-checkpoint/1"
WEIGHTS, OPTIMIZER, STATE = "model.safetensors", "optimizer.pt", "state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class ScheduleState(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: dict[str, Any]                 # the resolved schedule config
    lr_base_last: float | None = None      # base rate of the last update done
    lr_base_next: float | None = None      # schedule(step): what update `step` would use (CMA's hold value)
    start_step: int = 0
    total_steps: int = 0


class CheckpointState(BaseModel):
    """state.json. `kind` is `train` (resumable) or `average` (CMA output: weights only)."""

    model_config = ConfigDict(extra="forbid")

    schema_: str = Field(CHECKPOINT_SCHEMA, alias="schema")
    kind: str = Field("train", pattern="^(train|average)$")
    step: int
    tokens_seen: int
    run_start_step: int = 0
    data_cursor: dict[str, Any] | None = None
    schedule: ScheduleState | None = None
    rng: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any]                  # ModelConfig fields
    weights_dtype: str = "float32"
    sources: list[dict[str, Any]] = Field(default_factory=list)   # averages: the checkpoints averaged
    created_at: str = Field(default_factory=utc_now)
    code_version: str = Field(default_factory=code_version)

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


# --------------------------------------------------------------------------------------------
# RNG states (torch CPU, CUDA if present, numpy, python) as JSON
# --------------------------------------------------------------------------------------------

def capture_rng() -> dict[str, Any]:
    out = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": _np_state_to_json(np.random.get_state()),
        "python": _py_state_to_json(random.getstate()),
    }
    if torch.cuda.is_available():
        out["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return out


def restore_rng(rng: dict[str, Any]) -> None:
    if "torch" in rng:
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(rng["torch"])), dtype=torch.uint8))
    if "numpy" in rng:
        np.random.set_state(_np_state_from_json(rng["numpy"]))
    if "python" in rng:
        random.setstate(_py_state_from_json(rng["python"]))
    if "cuda" in rng and torch.cuda.is_available():
        states = [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in rng["cuda"]]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)


def _np_state_to_json(st) -> list:
    return [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])]


def _np_state_from_json(st) -> tuple:
    return (st[0], np.array(st[1], dtype=np.uint32), st[2], st[3], st[4])


def _py_state_to_json(st) -> list:
    return [st[0], list(st[1]), st[2]]


def _py_state_from_json(st) -> tuple:
    return (st[0], tuple(st[1]), st[2])


# --------------------------------------------------------------------------------------------
# Write / read
# --------------------------------------------------------------------------------------------

def save_checkpoint(directory: str | os.PathLike, weights: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any] | None, state: CheckpointState) -> Path:
    """Write a checkpoint directory atomically. `directory` is the final path (e.g. .../step_00000120)."""
    directory = Path(directory)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
    state = state.model_copy(update={"weights_dtype": ",".join(sorted(dtypes))})
    with atomic.atomic_path(directory) as tmp:
        tmp.mkdir()
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})   # one key: header bytes are deterministic
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER)
        (tmp / STATE).write_text(json.dumps(state.to_json_dict(), indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    return directory


def read_state(directory: str | os.PathLike) -> CheckpointState:
    """Read and validate state.json; errors name the file and the field."""
    path = Path(directory) / STATE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(path, "no state.json: not a checkpoint directory (or an incomplete one)") from None
    except json.JSONDecodeError as e:
        raise ContractError(path, f"not valid JSON ({e})") from None
    if raw.get("schema") != CHECKPOINT_SCHEMA:
        raise ContractError(path, f"schema is {raw.get('schema')!r}, this reader expects {CHECKPOINT_SCHEMA!r}",
                            field="schema")
    try:
        return CheckpointState.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise ContractError(path, f"{err['msg']} (input: {err.get('input')!r:.80})",
                            field=".".join(str(p) for p in err["loc"])) from None


def load_weights(directory: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(directory) / WEIGHTS
    if not path.is_file():
        raise ContractError(path, "weights file missing")
    return load_file(str(path), device=str(device))


def load_optimizer_state(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / OPTIMIZER
    if not path.is_file():
        raise ContractError(path, "optimizer state missing (an averaged checkpoint has none; "
                                  "use init_from.load_optimizer: false)")
    return torch.load(path, map_location="cpu", weights_only=True)


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, by step. Temporaries of a killed writer are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / STATE).is_file() and (p / WEIGHTS).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or a directory of checkpoints (-> the latest), or a run directory."""
    path = Path(path)
    if (path / STATE).is_file():
        return path
    for root in (path, path / "checkpoints"):
        latest = latest_checkpoint(root)
        if latest is not None:
            return latest
    raise ContractError(path, "no complete checkpoint here (expected state.json, step_* directories, "
                              "or a run directory with checkpoints/)")


def retained_steps(steps: list[int], keep_last: int, keep_every: int, protect: set[int] = frozenset()) -> set[int]:
    """Which steps survive: the last `keep_last`, every multiple of `keep_every` (0: none), `protect`."""
    keep = set(sorted(steps)[-keep_last:]) if keep_last > 0 else set()
    if keep_every > 0:
        keep |= {s for s in steps if s % keep_every == 0}
    return keep | (set(steps) & set(protect))


def prune(root: str | os.PathLike, keep_last: int, keep_every: int, protect: set[int] = frozenset()) -> list[int]:
    """Delete checkpoints outside the retention policy. Returns the deleted steps."""
    found = list_checkpoints(root)
    keep = retained_steps([s for s, _ in found], keep_last, keep_every, protect)
    deleted = []
    for step, path in found:
        if step not in keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(step)
    return deleted
