"""The training loop (`python -m trainer train`), also under `torchrun` with DDP or FSDP2 (gloo on
CPU, nccl on GPU). A short loop over parts that decide their own cadence (torchtitan's checkpointer and
validator, OLMo-core's callbacks):

- `trainer.runtime`: devices and process group (`Dist`), determinism, precision (autocast, the step's
  `PrecisionPlan`);
- `trainer.start`: where the run starts (its own newest checkpoint, `init_from`, or scratch), the checks
  that a continued run means what it says, the model config;
- `trainer.stream`: this rank's stream (one micro-batch cutter, `trainer.data`), read ahead on a thread,
  the held-out batches;
- `trainer.step`: the model, loss module and optimizer (`build`), and `Stepper`, one optimizer step over
  one global batch with no host synchronization in it;
- `trainer.records`: the metrics file, the progress (`purokit.progress.Reporter`), each step's record read
  one step late (the loop's one host synchronization a step);
- `trainer.checkpointer.Checkpointer.maybe_save(step)` and `trainer.evaluator.Evaluator.maybe_eval(step)`;
  and Python's GC, off during the loop, a young-generation collection every `train.gc_every_steps`.

The math is in `model`, `loss`, `optim`, `schedules`; the contract in `checkpoint`.

One optimizer step = one global batch of `train.global_batch` sequences, split across ranks and
micro-batches. The loss is the mean over every counted target token of the global batch (for SFT,
the assistant tokens), so 1 process with gradient accumulation and N processes at the same global
batch compute the same gradient. The loss is the chunked linear cross-entropy of `trainer.loss`
(no full logits), compiled with the blocks when `compile: true`.

Resume: on start, the newest complete checkpoint in `<run_dir>/checkpoints` is loaded (weights,
optimizer state, step, tokens seen, the reader's cursor, schedule state, RNG states) and the metrics
file is cut back to that step, so a run killed at any moment continues on exactly the trajectory it
would have taken (bit-exact on CPU).
"""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

import torch

from purokit import atomic, storage
from trainer import checkpoint as ckpt
from trainer.checkpointer import Checkpointer
from trainer.config import RunConfig
from trainer.evaluator import Evaluator, evaluate
from trainer.flops import shape_from_config
from trainer.model import count_params
from trainer.records import METRICS, MetricsLog, StepRecords, open_progress
from trainer.runtime import Dist, attention_context, device_peaks, resolve_precision, set_determinism
from trainer.start import StartState, average_protected_steps, check_schedule_extension, resolve_start
from trainer.step import Stepper, build, micro_loss_sum
from trainer.data import TokenStream
from trainer.stream import Prefetcher, check_enough_data, eval_batches, open_stream

# the loop's parts, importable from here as before the split
__all__ = ["Dist", "Stepper", "attention_context", "build", "eval_batches", "evaluate", "micro_loss_sum",
           "open_stream", "resolve_precision", "resolve_start", "train"]


def train(cfg: RunConfig, allow_config_change: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run (or resume) the training described by `cfg`. Returns a summary dict (rank 0).
    `allow_config_change` names guarded config keys a resume may change (`ckpt.GUARDED`)."""
    dist_ = Dist(cfg.device)
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    gc_before = gc.isenabled()
    try:
        return _train(cfg, dist_, tuple(allow_config_change))
    finally:
        torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)
        if gc_before:
            gc.enable()
        dist_.close()


@dataclasses.dataclass
class Run:
    """A run's parts, set up for its start."""
    cfg: RunConfig
    dist: Dist
    precision: str
    run_dir: Path                  # local files (metrics, logs)
    ckpt_dir: Path
    store: Path | None             # the object-store run directory outputs are published to, if any
    start: StartState
    stream: TokenStream
    stepper: Stepper
    records: StepRecords
    evaluator: Evaluator
    checkpointer: Checkpointer
    params: dict[str, int]


def _train(cfg: RunConfig, dist_: Dist, allow_config_change: tuple[str, ...] = ()) -> dict[str, Any]:
    run = open_run(cfg, dist_, allow_config_change)
    start, records, evaluator, checkpointer = run.start, run.records, run.evaluator, run.checkpointer
    step, tokens_seen, total_steps = start.step, start.tokens_seen, start.total_steps
    evaluator.at_start(start)

    # Python's cyclic GC stops the world for a full collection every few thousand allocations; a
    # step allocates thousands of small objects, so collections land in random steps (the periodic
    # stall). Off during the loop; a young-generation collection every train.gc_every_steps.
    gc.collect()
    gc.disable()
    prefetch = Prefetcher(run.stream, total_steps - step, pin=dist_.device.type == "cuda")
    if dist_.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dist_.device)
    records.restart_clock()
    while step < total_steps:
        info, loss_sum, grad_norm = run.stepper.take(step, tokens_seen, prefetch.next)
        step, tokens_seen = info.step, info.tokens_seen
        records.add(info, loss_sum, grad_norm)
        if cfg.train.gc_every_steps and step % cfg.train.gc_every_steps == 0:
            gc.collect(1)
        paused = evaluator.maybe_eval(step, tokens_seen, total_steps)
        paused |= checkpointer.maybe_save(step, tokens_seen, prefetch.cursor)
        if paused:
            records.restart_clock()                # time outside steps is not any step's time
    records.flush()
    gc.enable()

    evaluator.at_end(step, tokens_seen)
    checkpointer.at_end(step, tokens_seen, prefetch.cursor)
    return finish(run, step, tokens_seen)


def open_run(cfg: RunConfig, dist_: Dist, allow_config_change: tuple[str, ...]) -> Run:
    """The run directory prepared, the start resolved and checked, the stream opened, the model built; the
    step, records, evaluator and checkpointer made, and the start noted."""
    device = dist_.device
    set_determinism(cfg.deterministic if cfg.deterministic is not None else device.type == "cpu", device)
    precision = resolve_precision(cfg.precision, device)
    run_dir = storage.local_scratch(cfg.run_dir)       # metrics, logs: local files (in the cache for a URL)
    ckpt_dir = storage.path(cfg.run_dir) / "checkpoints"
    store = storage.path(cfg.run_dir) if storage.is_remote(cfg.run_dir) else None
    if dist_.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic.clean_stale_tmp(ckpt_dir)
        atomic.clean_stale_tmp(run_dir)
    dist_.barrier()

    start = resolve_start(cfg, ckpt_dir, allow_config_change)
    mbs = cfg.train.micro_batch
    stream = open_stream(cfg, dist_.rank, dist_.world, start.cursor, cfg.train.global_batch, mbs)
    tokens_per_step = cfg.train.global_batch * stream.seq_len
    check_schedule_extension(cfg, start, tokens_per_step)
    has_eval = eval_batches(cfg, dist_.rank, dist_.world, mbs) is not None
    held_out = (lambda: eval_batches(cfg, dist_.rank, dist_.world, mbs)) if has_eval else None  # noqa: E731
    check_enough_data(cfg, stream, start.total_steps - start.step, tokens_per_step)

    built = build(cfg, start, dist_, precision, stream.vocab_size, stream.seq_len)
    stepper = Stepper(built, cfg, dist_, precision, start, tokens_per_step)
    protect = average_protected_steps(cfg, start)
    metrics = MetricsLog(run_dir, start.step if start.kind == "resume" else None, dist_.is_main,
                         cfg.log.tensorboard, store)
    progress = open_progress(cfg.log.progress, start.total_steps, start.step, dist_.is_main, cfg.log.every_steps)
    records = StepRecords(dist_, metrics, progress, shape_from_config(built.model_cfg), stream.seq_len,
                          tokens_per_step, precision, device_peaks(device))
    run = Run(cfg, dist_, precision, run_dir, ckpt_dir, store, start, stream, stepper, records,
              Evaluator(cfg, held_out, built, dist_, precision, records),
              Checkpointer(cfg, ckpt_dir, dist_, built, start, tokens_per_step, protect, records),
              count_params(built.model))
    note_start(run, tokens_per_step, built.model, mbs * stream.seq_len)
    return run


def finish(run: Run, step: int, tokens_seen: int) -> dict[str, Any]:
    """The CMA average (if asked for), the records closed, and the run's summary (`summary.json`)."""
    store, run_dir, ckpt_dir = run.store, run.run_dir, run.ckpt_dir
    average_dir, average_eval = run.evaluator.average(store or run_dir, ckpt_dir, step, tokens_seen)
    run.records.progress.close()
    run.records.metrics.close()
    last_eval = run.evaluator.last
    summary = {"run_dir": str(store or run_dir), "step": step, "tokens_seen": tokens_seen, "params": run.params,
               "checkpoint": str(ckpt_dir / ckpt.step_dir_name(step)),
               "metrics": str((store / METRICS) if store else run.records.metrics.path),
               "eval_loss": last_eval["eval_loss"] if last_eval else None,
               "average": str(average_dir) if average_dir else None,
               "average_eval_loss": average_eval["eval_loss"] if average_eval else None}
    if run.dist.is_main:
        atomic.write_json(storage.path(run.cfg.run_dir) / "summary.json", summary)
    return summary


def note_start(run: Run, tokens_per_step: int, model: torch.nn.Module, micro_tokens: int) -> None:
    """The run's first note: where it starts, the model, precision, ranks, optimizer (and FP8's GEMM paths)."""
    cfg, start, params, dist_, progress = run.cfg, run.start, run.params, run.dist, run.records.progress
    where = {"resume": f"resumed from {start.directory}", "init": f"initialized from {start.directory}",
             "scratch": "from scratch"}[start.kind]
    progress.note(f"[trainer] {where}: step {start.step}/{start.total_steps}, {params['total']:,} params "
                  f"({params['non_embedding']:,} non-embedding), {run.precision} on {dist_.device}, {dist_.world} "
                  f"rank(s) ({cfg.parallel.data}), optimizer {cfg.optim.matrix}+adamw, {tokens_per_step:,} tokens/step")
    if run.precision == "fp8-blockwise":
        from trainer.fp8.paths import describe_gemm_paths
        progress.note(describe_gemm_paths(model, cfg.fp8, micro_tokens, dist_.device))
