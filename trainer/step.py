"""One optimizer step: the model and its loss as one module (what DDP and FSDP wrap), the model, loss
module and optimizer built for a start (FP8 conversion, activation checkpointing, per-block compile,
DDP/FSDP2, the checkpoint's state loaded), and `Stepper`, which runs a step over one global batch with
no host synchronization in it (the precision plan holds the step's weight copies)."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch

from purokit.log import get_logger
from trainer import checkpoint as ckpt
from trainer.config import RunConfig
from trainer.data import MicroBatch
from trainer.loss import DEFAULT_CHUNK_TOKENS, chunk_loss_and_grads, linear_cross_entropy_sum
from trainer.model import ModelConfig, Transformer, build_model
from trainer.optim import build_optimizer
from trainer.runtime import Dist, PrecisionPlan, attention_context, autocast_context
from trainer.schedules import lr_at
from trainer.start import StartState, resolve_model_config

log = get_logger("trainer")


class LossModel(torch.nn.Module):
    """The model and its loss as one module: forward(micro-batch) = sum of the counted targets'
    cross entropy (chunked through the LM head, `trainer.loss`). `chunk_fn` is the compiled chunk
    under `compile: true`."""

    def __init__(self, model: Transformer, use_doc_mask: bool = False, chunk_fn=chunk_loss_and_grads,
                 chunk_tokens: int = DEFAULT_CHUNK_TOKENS):
        super().__init__()
        self.model = model
        self.use_doc_mask = use_doc_mask
        self.chunk_fn = chunk_fn
        self.chunk_tokens = chunk_tokens

    def forward(self, inputs, targets, loss_mask=None, positions=None, doc_ids=None) -> torch.Tensor:
        with attention_context(inputs.device):
            h = self.model.hidden(inputs, positions=positions, doc_ids=doc_ids if self.use_doc_mask else None)
        return linear_cross_entropy_sum(h, self.model.lm_head.weight, targets, loss_mask,
                                        chunk_tokens=self.chunk_tokens, chunk_fn=self.chunk_fn)


def micro_loss_sum(loss_model, mb: MicroBatch) -> torch.Tensor:
    return loss_model(mb.inputs, mb.targets, mb.loss_mask, mb.positions, mb.doc_ids)


def zero_grad_fractions(model: torch.nn.Module) -> dict[str, float]:
    """Fraction of exactly-zero gradient entries per layer (embed, layers.i, norm, lm_head)."""
    zeros: dict[str, torch.Tensor] = {}
    total: dict[str, int] = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        parts = name.split(".")
        if parts[0] == "model" and parts[1] == "layers":
            key = f"layers.{parts[2]}"
        elif parts[0] == "model":
            key = "embed" if parts[1] == "embed_tokens" else parts[1]
        else:
            key = parts[0]
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        zeros[key] = zeros.get(key, 0) + (g == 0).sum()
        total[key] = total.get(key, 0) + g.numel()
    counts = torch.stack([torch.as_tensor(zeros[k]) for k in total]).tolist() if total else []   # one host sync
    return {k: c / total[k] for k, c in zip(total, counts)}


@dataclasses.dataclass
class Built:
    model: Transformer            # the bare model: checkpoints, zero-grad fractions, clipping
    model_cfg: ModelConfig
    loss_model: torch.nn.Module   # what the step calls (DDP- or FSDP-wrapped under torchrun)
    optimizer: Any


def build(cfg: RunConfig, start: StartState, dist_: Dist, precision: str, data_vocab: int, seq_len: int) -> Built:
    from trainer import parallel

    device = dist_.device
    model_cfg = resolve_model_config(cfg, start.state, data_vocab, seq_len)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, seed=cfg.seed, device=device)
    if precision == "fp8-blockwise":
        from trainer.fp8 import convert_to_fp8
        convert_to_fp8(model, cfg.fp8)
    if start.directory is not None:
        missing, unexpected = model.load_state_dict(ckpt.load_weights(start.directory, device), strict=False)
        missing = [k for k in missing if not k.startswith("rope_")]
        if missing or unexpected:
            raise ValueError(f"{start.directory}: weights do not fit the model (missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]})")
    parallel.apply_activation_checkpointing(model, cfg.parallel.activation_checkpointing)
    chunk_fn = chunk_loss_and_grads
    if cfg.compile:
        for block in model.model.layers:          # per-block: one graph, compiled once, reused by every block
            block.compile()
        model.model.norm.compile()
        chunk_fn = torch.compile(chunk_loss_and_grads)
    loss_model: torch.nn.Module = LossModel(model, cfg.data.document_mask, chunk_fn)
    fsdp = cfg.parallel.data == "fsdp" and dist_.world > 1
    if fsdp:
        loss_model = parallel.apply_fsdp(loss_model, model, device, precision)
    optimizer = build_optimizer(model, cfg.optim, compile=cfg.compile)

    def saved_optimizer_state():
        state = ckpt.load_optimizer_state(start.directory)
        return parallel.shard_optimizer_state(state, optimizer) if fsdp else state

    if start.kind == "resume":
        optimizer.load_state_dict(saved_optimizer_state())
        ckpt.restore_rng(start.state.rng.get(str(dist_.rank), start.state.rng.get("0", {})))
    elif start.kind == "init" and cfg.init_from.load_optimizer:
        if any("hf" in s for s in start.state.sources):
            log.info("%s was imported from Hugging Face: no optimizer state, the optimizer starts fresh", start.directory)
        else:
            optimizer.load_state_tensors(saved_optimizer_state())
    if dist_.world > 1 and cfg.parallel.data == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        loss_model = DDP(loss_model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_model.train()
    return Built(model, model_cfg, loss_model, optimizer)


@dataclasses.dataclass
class StepInfo:
    """What the host knows of a step when it is queued (its loss and gradient norm come later)."""
    step: int
    tokens_seen: int
    lr_base: float
    lrs: dict[str, float]
    global_count: float
    extra: dict[str, Any]           # detail steps: effective LR, zero-gradient fractions


class Stepper:
    """One optimizer step over this rank's micro-batches of a global batch. Returns the loss sum and
    the gradient norm as device tensors (`StepRecords` reads them after the next step is queued), and on
    detail steps the zero-gradient fractions (rank 0)."""

    def __init__(self, built: Built, cfg: RunConfig, dist_: Dist, precision: str, start: StartState | None = None,
                 tokens_per_step: int = 0):
        self.b, self.cfg, self.dist, self.precision = built, cfg, dist_, precision
        self.start, self.tokens_per_step = start, tokens_per_step      # the schedule `take` follows
        self.detail_every = cfg.log.detail_every or (1 if dist_.device.type == "cpu" else 100)
        self.ddp = dist_.world > 1 and cfg.parallel.data == "ddp"
        self.fsdp = dist_.world > 1 and cfg.parallel.data == "fsdp"
        # the step's weights: BF16 copies cast once a step, FP8 weights quantized once a step (one process)
        self.precision_plan = PrecisionPlan(built.model, precision, dist_.world,
                                            compile_adds=cfg.compile and dist_.device.type == "cuda")

    def __call__(self, micro: list[MicroBatch], denom: float, detail: bool = False):
        device, world = self.dist.device, self.dist.world
        loss_model, model, optimizer = self.b.loss_model, self.b.model, self.b.optimizer
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        with self.precision_plan.step_context():
            for i, mb in enumerate(micro):
                mb = mb.to(device)
                last = i == len(micro) - 1
                ctx = loss_model.no_sync() if (self.ddp and not last) else contextlib.nullcontext()
                if self.fsdp:
                    loss_model.set_requires_gradient_sync(last)     # reduce-scatter once per step
                with ctx:
                    with autocast_context(self.precision, device):
                        s = micro_loss_sum(loss_model, mb)
                    # DDP and FSDP average gradients over ranks; scale so the result is sum / global count
                    (s * (world / denom)).backward()
                self.precision_plan.after_backward()
                loss_sum += s.detach()
        zero_frac = zero_grad_fractions(model) if detail and self.dist.is_main else None
        clip = self.cfg.optim.grad_clip
        params = [p for p in model.parameters() if p.grad is not None]
        if clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, clip, foreach=True)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum, grad_norm, zero_frac

    def take(self, step: int, tokens_seen: int, next_batch: Callable[[], list[MicroBatch]]):
        """Optimizer step `step + 1` of the run over the global batch `next_batch()` returns: the schedule's
        learning rates, the batch's counted targets summed over the ranks, the step (with the per-layer detail
        every `log.detail_every` steps). Returns its `StepInfo` and its loss sum and gradient norm (device tensors)."""
        st, optimizer = self.start, self.b.optimizer
        lr_base = lr_at(st.schedule, step, total_steps=st.total_steps, tokens_per_step=self.tokens_per_step,
                        start_step=st.start_step)
        lrs = optimizer.set_lr(lr_base)
        micro = next_batch()
        (global_count,) = self.dist.all_reduce_sum([float(sum(mb.n_loss_tokens for mb in micro))])
        detail = (step + 1) % self.detail_every == 0
        optimizer.measure_effective_lr(detail)
        loss_sum, grad_norm, zero_frac = self(micro, max(global_count, 1.0), detail)
        extra = {"effective_lr": {k: sum(v) / len(v) for k, v in optimizer.effective_lr.items()},
                 "zero_grad_frac": zero_frac} if detail and self.dist.is_main else {}
        info = StepInfo(step + 1, tokens_seen + self.tokens_per_step, lr_base, lrs, global_count, extra)
        return info, loss_sum, grad_norm
