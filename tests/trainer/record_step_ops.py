"""The CPU aten-op sequence of one training step, as `python -m trainer train` runs it.

Builds a tiny run through the loop's own parts (start, stream, model and optimizer, the step), takes
one warm-up step, then records the second step (learning rates set, effective-LR measurement, the
micro-batches' forward and backward, gradient clipping, optimizer step) under `torch.profiler` and
returns the ordered op names. `tests/trainer/data/step_ops_{bf16,fp8}.json` hold the sequences the
code gave before the loop was split into parts; `test_step_ops.py` asserts the code still gives them.

    python tests/trainer/record_step_ops.py        # rewrite the JSON files from the current code
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data"
PRECISIONS = {"bf16": "bf16", "fp8": "fp8-blockwise"}      # file tag -> run precision (FP8: CPU emulation)
NAMESPACES = ("aten::", "purokit_fp8::")                     # torch's ops and the FP8 package's own


def run_config(run_dir: str, precision: str):
    from trainer.config import load_run_config

    return load_run_config(None, data={
        "run_dir": run_dir, "precision": precision, "device": "cpu",
        "model": {"preset": "tiny"}, "data": {"synthetic": {"vocab_size": 512, "seq_len": 128}},
        "train": {"steps": 2, "global_batch": 4, "micro_batch": 2},
        "schedule": {"kind": "constant", "lr": 3e-3, "warmup_steps": 1},
        "checkpoint": {"every_steps": 0, "at_end": False}, "log": {"progress": "none"}})


def step_parts(cfg):
    """The loop's parts for `cfg`: a function that runs optimizer step `step + 1` over a global batch as the
    loop does (`Stepper.take`: learning rates, counted targets, effective-LR measurement, the step), and the stream."""
    from trainer.runtime import Dist, resolve_precision
    from trainer.start import resolve_start
    from trainer.step import Stepper, build
    from trainer.stream import open_stream

    dist_ = Dist(cfg.device)
    precision = resolve_precision(cfg.precision, dist_.device)
    start = resolve_start(cfg, Path(cfg.run_dir) / "checkpoints")
    stream = open_stream(cfg, 0, 1, start.cursor, cfg.train.global_batch, cfg.train.micro_batch)
    built = build(cfg, start, dist_, precision, stream.vocab_size, stream.seq_len)
    stepper = Stepper(built, cfg, dist_, precision, start, cfg.train.global_batch * stream.seq_len)

    def run_step(step: int, micro):
        return stepper.take(step, 0, lambda: micro)

    return run_step, stream


def step_ops(tag: str) -> list[str]:
    """The ordered op names of the second training step at precision `tag` (bf16 or fp8)."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # the op sequence depends on the intra-op thread count (one per xdist worker)
    try:
        return _step_ops(tag)
    finally:
        torch.set_num_threads(threads)


def _step_ops(tag: str) -> list[str]:
    with tempfile.TemporaryDirectory() as run_dir:
        run_step, stream = step_parts(run_config(run_dir, PRECISIONS[tag]))
        run_step(0, stream.next_global_batch())                  # warm-up: optimizer state, step buffers
        micro = stream.next_global_batch()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run_step(1, micro)
    events = sorted(prof.events(), key=lambda e: (e.time_range.start, -e.time_range.end, e.id))
    return [e.name for e in events if e.name.startswith(NAMESPACES)]


def main() -> None:
    DATA.mkdir(exist_ok=True)
    for tag in PRECISIONS:
        ops = step_ops(tag)
        (DATA / f"step_ops_{tag}.json").write_text(json.dumps(ops, indent=0) + "\n")
        print(f"{tag}: {len(ops)} ops", file=sys.stderr)


if __name__ == "__main__":
    main()
