"""The checkpoint contract (ARCHITECTURE.md contract 5): one directory per checkpoint,

    <checkpoints>/step_00000120/
        model.safetensors     weights, Hugging Face-style names (fp32 master weights; BF16 for averages)
        optimizer.pt          optimizer state (absent for averaged checkpoints)
        state.json            schema, step, tokens seen, the reader's cursor, schedule state, RNG
                              states, the run config, the model config

written atomically (temporary directory, then rename), so a killed writer never leaves a half
checkpoint that a reader could pick up. `list_checkpoints` returns only complete ones. Retention keeps
the last N plus every K-th step (`prune`).

state.json records the sha256 of every tensor file (`files`); `load_weights` and
`load_optimizer_state` check it before loading, so a flipped bit or a truncated file is an error
naming the file, never a model trained on. `resume_point` picks the newest checkpoint that passes
(a damaged one is reported by path and the one before it is used) and refuses a resume whose
config changes the model or the data order (`GUARDED`) unless the change is allowed by name.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch
from pydantic import Field
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from purokit import atomic, storage
from purokit.config import StrictModel, load_contract
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.log import get_logger
from purokit.manifest import utc_now
from purokit.version import code_version

log = get_logger("trainer.checkpoint")

CHECKPOINT_SCHEMA = "trainer-checkpoint/1"
WEIGHTS, OPTIMIZER, STATE = "model.safetensors", "optimizer.pt", "state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


class ScheduleState(StrictModel):
    config: dict[str, Any]                 # the resolved schedule config
    lr_base_last: float | None = None      # base rate of the last update done
    lr_base_next: float | None = None      # schedule(step): what update `step` would use (CMA's hold value)
    start_step: int = 0
    total_steps: int = 0


class CheckpointState(StrictModel):
    """state.json. `kind` is `train` (resumable) or `average` (CMA output: weights only)."""


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
    files: dict[str, str] = Field(default_factory=dict)   # sha256 of each tensor file (older checkpoints: none)
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
    directory = storage.path(directory)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
    state = state.model_copy(update={"weights_dtype": ",".join(sorted(dtypes))})
    with atomic.atomic_path(directory) as tmp:
        tmp.mkdir()
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})   # one key: header bytes are deterministic
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER)
        state = state.model_copy(update={"files": {f.name: sha256_file(f) for f in sorted(tmp.iterdir())}})
        (tmp / STATE).write_text(json.dumps(state.to_json_dict(), indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    return directory


def read_state(directory: str | os.PathLike) -> CheckpointState:
    """Read and validate state.json; errors name the file and the field."""
    return load_contract(CheckpointState, storage.local_copy(directory) / STATE, CHECKPOINT_SCHEMA,
                         "no state.json: not a checkpoint directory (or an incomplete one)")


_VERIFIED: set[tuple[str, int, int, str]] = set()     # (path, size, mtime_ns, sha256) already checked


def verify_file(directory: str | os.PathLike, name: str) -> None:
    """Check one tensor file of a checkpoint against the sha256 its state.json records (older
    checkpoints record none: nothing to check). Raises ContractError naming the file (by its URL
    for an object-store checkpoint)."""
    path = storage.local_copy(directory) / name
    want = read_state(directory).files.get(name)
    if want is None or not path.is_file():
        return
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, want)
    if key in _VERIFIED:
        return
    got = sha256_file(path)
    if got != want:
        raise ContractError(storage.path(directory) / name, f"sha256 {got[:16]}… does not match the {want[:16]}… "
                                                            "recorded in state.json: the checkpoint is damaged")
    _VERIFIED.add(key)


def verify_checkpoint(directory: str | os.PathLike) -> CheckpointState:
    """state.json, with every tensor file it lists checked against its sha256 (an older checkpoint
    without hashes: the weights' header is parsed). Raises ContractError naming the bad file."""
    location = storage.path(directory)
    directory = storage.local_copy(directory)      # an object-store checkpoint: staged, sha256-checked
    state = read_state(directory)
    for name in state.files:
        if not (directory / name).is_file():
            raise ContractError(location / name, "missing (state.json records its sha256)")
        verify_file(location, name)
    if not state.files:
        try:
            with safe_open(str(directory / WEIGHTS), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise ContractError(location / WEIGHTS, f"not a readable safetensors file ({e})") from None
    return state


def load_weights(directory: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = storage.local_copy(directory) / WEIGHTS
    if not path.is_file():
        raise ContractError(path, "weights file missing")
    verify_file(directory, WEIGHTS)
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError) as e:
        raise ContractError(path, f"weights unreadable ({e})") from None


def load_optimizer_state(directory: str | os.PathLike) -> dict[str, Any]:
    path = storage.local_copy(directory) / OPTIMIZER
    if not path.is_file():
        raise ContractError(path, "optimizer state missing (an averaged checkpoint has none; "
                                  "use init_from.load_optimizer: false)")
    verify_file(directory, OPTIMIZER)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, OSError, EOFError, ValueError) as e:     # truncated zip, bad pickle
        raise ContractError(path, f"optimizer state unreadable ({type(e).__name__}: {e})") from None


# --------------------------------------------------------------------------------------------
# Resume: the newest checkpoint that passes its checks, with a config that may continue it
# --------------------------------------------------------------------------------------------

# Config keys (and sections) whose change would alter the model or the order of the data: a
# resumed run with another value is a different run, refused unless allowed by name.
GUARDED = ("model", "precision", "seed", "objective", "train.global_batch", "data.train", "data.seq_len",
           "data.synthetic", "data.document_mask", "data.document_positions")
# Keys a resumed run may change freely (how long, how it logs and saves, where it runs).
FREE = ("train.steps", "train.micro_batch", "train.gc_every_steps", "schedule.extend", "log", "eval",
        "checkpoint", "notes", "device", "compile", "deterministic", "parallel", "fp8", "run_dir")


def config_changes(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dumps (nested sections compared key by key)."""
    out = []
    for k in sorted(set(saved) | set(current)):
        key = f"{prefix}{k}"
        a, b = saved.get(k), current.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_changes(a, b, key + ".")
        elif a != b:
            out.append(key)
    return out


def _under(key: str, sections: Iterable[str]) -> bool:
    return any(key == s or key.startswith(s + ".") for s in sections)


def _allowed(key: str, allow: Iterable[str]) -> bool:
    """`allow` names a key by its full path (`model.overrides.d_model`), its last parts (`d_model`,
    `overrides.d_model`) or a section (`model`)."""
    return any(key == a or key.endswith("." + a) or key.startswith(a + ".") for a in allow)


def check_resume_config(saved: dict[str, Any], current: dict[str, Any], allow: Iterable[str] = (),
                        where: object = "checkpoint") -> list[str]:
    """Refuse (ContractError) a resume whose config changes a `GUARDED` key that `allow` does not
    name; return the other changed keys (not `FREE`), which the caller reports."""
    allow = list(allow)
    changed = [k for k in config_changes(saved, current) if not _under(k, FREE)]
    refused = [k for k in changed if _under(k, GUARDED) and not _allowed(k, allow)]
    if refused:
        detail = ", ".join(f"{k}: {_value_at(saved, k)!r} -> {_value_at(current, k)!r}" for k in refused)
        names = " ".join(k.split(".")[-1] for k in refused)
        raise ContractError(where, f"resuming would change the model or the data order ({detail}); "
                                   f"restore the saved values, start a new run_dir, or pass "
                                   f"--allow-config-change {names}", field=refused[0])
    return [k for k in changed if k not in refused]


def _value_at(config: dict[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


DAMAGED_SUFFIX = ".damaged"


def resume_point(ckpt_dir: str | os.PathLike, config: dict[str, Any],
                 allow_changes: Iterable[str] = ()) -> tuple[Path, CheckpointState] | None:
    """The checkpoint a run resumes from: the newest complete one whose files match their sha256
    (a damaged one is reported by path and renamed `<step dir>.damaged`, and the one before it
    tried), with its config checked
    against `config` (`check_resume_config`). None when the run has no checkpoint yet; a
    ContractError when every checkpoint is damaged."""
    damaged: list[str] = []
    for _, directory, unreadable in reversed(_step_dirs(ckpt_dir)):
        try:
            if unreadable is not None:
                raise unreadable
            state = verify_checkpoint(directory)
            if state.kind == "train":
                verify_file(directory, OPTIMIZER)
        except ContractError as e:
            aside = directory.with_name(directory.name + DAMAGED_SUFFIX)
            log.warning("checkpoint %s is damaged (%s); moved to %s, resuming from the one before it",
                        directory, e, aside.name)
            damaged.append(str(e))
            # kept for a post-mortem; no longer a checkpoint, so the resumed run writes this step again
            # (another rank may have moved it already)
            storage.move_aside(directory, aside)
            continue
        others = check_resume_config(state.config, config, allow_changes, directory / STATE)
        if others:
            log.warning("resuming %s with a changed config: %s", directory, ", ".join(others))
        return directory, state
    if damaged:
        raise ContractError(ckpt_dir, "every checkpoint is damaged (" + "; ".join(damaged) + ")")
    return None


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints under `root`, by step. Temporaries of a killed writer are ignored, and
    so is a step whose commit record is unreadable (`resume_point` reports and moves it aside)."""
    return [(step, p) for step, p, unreadable in _step_dirs(root) if unreadable is None]


def _step_dirs(root: str | os.PathLike) -> list[tuple[int, Path, ContractError | None]]:
    """(step, directory, None) for each complete checkpoint under `root`, and (step, directory,
    the error) for each step directory on an object store whose commit record is unreadable."""
    root = storage.path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if not (m and p.is_dir()):
            continue
        try:
            if storage.has_committed(p, STATE) and storage.has_committed(p, WEIGHTS):
                out.append((int(m.group(1)), p, None))
        except ContractError as e:
            out.append((int(m.group(1)), p, e))
    return sorted(out, key=lambda t: t[0])


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or a directory of checkpoints (-> the latest), or a run directory."""
    path = storage.path(path)
    if storage.has_committed(path, STATE):
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
            storage.remove_tree(path)
            deleted.append(step)
    return deleted
