"""Held-out evaluation: the mean loss over every counted target of the held-out set (`evaluate`), the
`Evaluator` that runs it on its own cadence (at the start, every `eval.every_steps`, at the end) and
records it, and the CMA average of the last checkpoints, evaluated at the end of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from purokit import storage
from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.data import MicroBatch
from trainer.model import Transformer
from trainer.records import StepRecords
from trainer.runtime import Dist, autocast_context
from trainer.start import StartState
from trainer.step import Built, LossModel, micro_loss_sum


@torch.no_grad()
def evaluate(model, batches, dist_: Dist, precision: str, use_doc_mask: bool) -> dict[str, float]:
    """Mean held-out loss over every counted target of `batches` (this rank's share), all ranks.
    `model` is the loss module, or a bare `Transformer` (then wrapped)."""
    loss_model = LossModel(model, use_doc_mask) if isinstance(model, Transformer) else model
    was_training = loss_model.training
    loss_model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=dist_.device)
    count = 0
    for mb in batches:
        mb = mb.to(dist_.device)
        with autocast_context(precision, dist_.device):
            loss_sum += micro_loss_sum(loss_model, mb).double()
        count += mb.n_loss_tokens
    total, count = dist_.all_reduce_sum([float(loss_sum), float(count)])
    loss_model.train(was_training)
    return {"eval_loss": total / max(count, 1.0), "eval_tokens": int(count)}


class Evaluator:
    """Evaluates the model on the held-out set (`batches()`: a fresh iterator of this rank's micro-batches;
    None without a held-out set) at the run's start, every `eval.every_steps` steps before the last and at
    the end, and records each evaluation (metrics and a progress note). `last` is the newest evaluation's
    record (a resumed run starts from the metrics file's)."""

    def __init__(self, cfg: RunConfig, batches: Callable[[], Iterable[MicroBatch]] | None, built: Built, dist_: Dist,
                 precision: str, records: StepRecords):
        self.cfg, self.batches, self.b, self.dist, self.precision = cfg, batches, built, dist_, precision
        self.records = records
        self.last: dict[str, Any] | None = records.metrics.last_eval
        self.last_step: int | None = records.metrics.last_eval_step

    def run(self, step: int, tokens_seen: int) -> None:
        if self.batches is None:
            return
        self.last_step = step
        self.last = evaluate(self.b.loss_model, self.batches(), self.dist, self.precision, self.cfg.data.document_mask)
        self.records.metrics.write({"kind": "eval", "step": step, "tokens_seen": tokens_seen, **self.last})
        self.records.progress.note(f"[eval] step {step}: held-out loss {self.last['eval_loss']:.4f}")

    def at_start(self, start: StartState) -> None:
        """The starting weights' loss, for a run that starts (not resumes) with periodic evaluation."""
        if start.step == start.start_step and start.kind != "resume" and self.batches is not None \
                and self.cfg.eval.every_steps:
            self.run(start.step, start.tokens_seen)

    def maybe_eval(self, step: int, tokens_seen: int, total_steps: int) -> bool:
        """Evaluate at every `eval.every_steps`-th step before the last (after the step in flight is recorded)."""
        every = self.cfg.eval.every_steps
        if not (every and step % every == 0 and step < total_steps):
            return False
        self.records.flush()
        self.run(step, tokens_seen)
        return True

    def at_end(self, step: int, tokens_seen: int) -> None:
        if self.batches is not None and self.cfg.eval.at_end and self.last_step != step:
            self.run(step, tokens_seen)

    def average(self, run_dir: Path, ckpt_dir: Path, step: int, tokens_seen: int):
        """The CMA average at the end of the run (`average: ...`), and its held-out loss: made and evaluated
        once (a finished run started again finds both). Returns (directory, eval record), or Nones."""
        cfg = self.cfg
        if cfg.average is None:
            return None, None
        done = self.records.metrics.last_average_eval
        if done is not None and done["step"] == step and storage.has_committed(run_dir / "average", ckpt.STATE):
            return run_dir / "average", done
        out, result = build_average(cfg, run_dir, ckpt_dir, self.b, self.batches, self.dist, self.precision)
        if result is not None:
            self.records.metrics.write({"kind": "eval", "model": "average", "step": step, "tokens_seen": tokens_seen,
                                        **result})
            self.records.progress.note(f"[eval] average of {cfg.average.n} checkpoints: held-out loss "
                                       f"{result['eval_loss']:.4f}")
        return out, result


def build_average(cfg: RunConfig, run_dir: Path, ckpt_dir: Path, built: Built, eval_factory, dist_: Dist,
                  precision: str):
    """CMA at the end of the run: average the last n checkpoints into <run_dir>/average, then
    evaluate the averaged weights on the held-out set (the trained weights are replaced in memory;
    the run's own checkpoints are untouched)."""
    from trainer import parallel
    from trainer.average import average_last

    out = run_dir / "average"
    if dist_.is_main:
        average_last(ckpt_dir, out, n=cfg.average.n, spacing=cfg.average.spacing,
                     dtype=getattr(torch, cfg.average.dtype))
    dist_.barrier()
    if eval_factory is None:
        return out, None
    parallel.load_full_state_dict(built.model, ckpt.load_weights(out, dist_.device))
    return out, evaluate(built.loss_model, eval_factory(), dist_, precision, cfg.data.document_mask)
