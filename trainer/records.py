"""What a run records: the metrics file (JSONL, optional TensorBoard, published to an object-store run
directory), the progress reporter (`purokit.progress.Reporter`: bar, line or none) and the per-step
records, each read one step late (`StepRecords`: the loop's one host synchronization a step)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from purokit import atomic, storage
from purokit.progress import Reporter
from trainer.flops import throughput_report
from trainer.runtime import Dist
from trainer.step import StepInfo

METRICS = "metrics.jsonl"


class MetricsLog:
    """JSONL metrics (rank 0), cut back to the resume step so nothing is duplicated; optional TensorBoard."""

    def __init__(self, run_dir: Path, keep_up_to_step: int | None, enabled: bool, tensorboard: bool,
                 store: Any = None):
        """keep_up_to_step: the resume step (records after it are dropped); None: start afresh.
        store: the object-store run directory the local files are published to (None: run_dir is it)."""
        self.path = run_dir / METRICS
        self.store = store
        self.enabled = enabled
        self.tb = None
        self.last_eval_step: int | None = None
        self.last_eval: dict[str, Any] | None = None           # the newest eval record of the model
        self.last_average_eval: dict[str, Any] | None = None   # and of the CMA average
        if not enabled:
            return
        keep = []
        if store is not None and not self.path.exists() and storage.exists(store / METRICS):
            self.path.write_bytes((store / METRICS).read_bytes())     # resumed on another machine
        if self.path.exists() and keep_up_to_step is not None:
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue                              # a line cut by a kill
                if rec.get("step", 0) <= keep_up_to_step:
                    keep.append(line)
                    if rec.get("kind") == "eval" and rec.get("model") == "average":
                        self.last_average_eval = rec
                    elif rec.get("kind") == "eval":
                        self.last_eval_step, self.last_eval = rec["step"], rec
        atomic.write_text(self.path, "".join(l + "\n" for l in keep))
        self.fh = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("log.tensorboard is on but TensorBoard is not installed: "
                                   "pip install 'purokit[tensorboard]'") from e
            self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.fh.write(json.dumps(rec, sort_keys=True) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for k, v in _flatten(rec).items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, rec["step"])

    def publish(self) -> None:
        """Copy the metrics (and TensorBoard's files) to the object-store run directory."""
        if not self.enabled or self.store is None:
            return
        self.fh.flush()
        storage.write_bytes(self.store / METRICS, self.path.read_bytes())
        if self.tb is not None:
            self.tb.flush()
            local = self.path.parent / "tensorboard"
            for rel, _, _ in storage.list_files(local):
                storage.write_bytes(self.store / "tensorboard" / rel, (local / rel).read_bytes())

    def close(self) -> None:
        if self.enabled:
            self.publish()
            self.fh.close()
            if self.tb is not None:
                self.tb.close()


def _flatten(rec: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in rec.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


class _Quiet(Reporter):
    """The reporter of a rank other than 0: no progress, no notes."""

    def note(self, text: str) -> None:
        pass


def open_progress(mode: str, total: int, start: int, is_main: bool, every: int) -> Reporter:
    """The run's progress in steps (rank 0; the other ranks are quiet)."""
    if not is_main:
        return _Quiet(total, unit="step", mode="none", initial=start)
    return Reporter(total, unit="step", mode=mode, every=every, initial=start)


def progress_message(rec: dict[str, Any]) -> str:
    """A train record as the progress shows it: `loss 2.1234 lr 3.000e-03 gnorm 0.512 812 tok/s`."""
    msg = f"loss {rec['loss']:.4f} lr {rec['lr_base']:.3e} gnorm {rec['grad_norm']:.3f} {rec['tokens_per_s']:.0f} tok/s"
    if "mfu" in rec:
        msg += f" mfu {100 * rec['mfu']:.1f}%"
    if "peak_mem_gib" in rec:
        msg += f" mem {rec['peak_mem_gib']:.1f} GiB"
    return msg


class StepRecords:
    """The per-step records, each read one step late. When a step is queued, its loss sum and gradient
    norm are queued too for a non-blocking copy into pinned host memory, followed by an event; the
    record of step N is written after step N+1 is queued, waiting on step N's event only (a plain
    `.item()` would wait for everything queued, step N+1 included). So the GPU never idles while the
    host writes a record, sets the next learning rates and queues the next micro-batches. A step's time
    is the GPU's, between the events that end it and the step before it (on CPU, the host's clock). A
    non-finite loss stops the run before any checkpoint after it is written: the evaluator and the
    checkpointer flush the step in flight before they act."""

    def __init__(self, dist_: Dist, metrics: MetricsLog, progress: Reporter, shape, seq_len: int,
                 tokens_per_step: int, precision: str, peaks):
        self.dist, self.metrics, self.progress = dist_, metrics, progress
        self.shape, self.seq_len, self.tokens_per_step = shape, seq_len, tokens_per_step
        self.precision, self.peaks = precision, peaks
        self.cuda = dist_.device.type == "cuda"
        self.pending: tuple[StepInfo, torch.Tensor, Any] | None = None    # the step in flight
        self.mark: Any = None                          # the end of the last step (`restart_clock` before the first)

    def _now(self):
        """This point of the stream (a timing event on CUDA), or the host's clock."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def restart_clock(self) -> None:
        """Time outside steps (evaluation, checkpoints) is not any step's time."""
        self.mark = self._now()

    def add(self, info: StepInfo, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """Queue the step's numbers for the host, then write the previous step's record."""
        if self.dist.world > 1:
            loss_sum = loss_sum.clone()
            dist.all_reduce(loss_sum)                   # in the stream (NCCL); gloo on CPU returns done
        values = torch.stack([loss_sum.double(), grad_norm.detach().double()])
        if self.cuda:
            host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            values = host.copy_(values, non_blocking=True)
        previous, self.pending = self.pending, (info, values, self._now())
        if previous is not None:
            self._record(*previous)

    def flush(self) -> None:
        if self.pending is not None:
            last, self.pending = self.pending, None
            self._record(*last)

    def _record(self, p: StepInfo, values: torch.Tensor, done) -> None:
        if self.cuda:
            done.synchronize()                          # step p's end, not what was queued after it
            dt = self.mark.elapsed_time(done) / 1e3
        else:
            dt = done - self.mark
        self.mark = done
        loss_sum, grad_norm = values.tolist()
        loss = loss_sum / max(p.global_count, 1.0)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {p.step}; stopping (last checkpoint is intact)")
        if not self.dist.is_main:
            return
        rec: dict[str, Any] = {"kind": "train", "step": p.step, "tokens_seen": p.tokens_seen, "loss": loss,
                               "lr_base": p.lr_base, "lr": p.lrs, "grad_norm": grad_norm,
                               "loss_tokens": int(p.global_count), "step_time_s": dt,
                               "tokens_per_s": self.tokens_per_step / dt if dt > 0 else 0.0}
        if self.peaks is not None and dt > 0:
            rec["mfu"] = throughput_report(self.shape, self.seq_len, self.tokens_per_step, dt,
                                           fp8=self.precision == "fp8-blockwise", peaks=self.peaks,
                                           n_gpus=self.dist.world)["mfu_vs_bf16_peak"]
        if self.cuda:
            rec["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.dist.device) / 2**30
        rec.update(p.extra)
        self.metrics.write(rec)
        self.progress.update(p.step, progress_message(rec))
