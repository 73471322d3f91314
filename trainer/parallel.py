"""Around the model, not in it (the torchtitan split): activation checkpointing and how the full
weights and optimizer state are gathered for a checkpoint.

Activation checkpointing (`parallel.activation_checkpointing`):

- `none`: every block keeps its activations for the backward;
- `selective`: a block keeps the outputs of its matrix products and attention and recomputes the
  cheap ops between them (norms, RoPE, SwiGLU's product) in the backward (torchtitan's op-level SAC);
- `full`: a block keeps only its input and recomputes its whole forward in the backward.

Applied per block by replacing the block instance's `forward`, so parameter names, state dicts and
export are unchanged, and before `torch.compile` so the compiled block contains the recomputation.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from trainer.model import Transformer

AC_MODES = ("none", "selective", "full")


def _saved_ops() -> set:
    aten = torch.ops.aten
    names = ["mm", "addmm", "bmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu"]
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def _selective_policy(saved: set):
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _checkpointed(forward, context_fn, *args):
    if not torch.is_grad_enabled():
        return forward(*args)
    if context_fn is None:
        return checkpoint(forward, *args, use_reentrant=False)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn)


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """Wrap every block's forward in activation checkpointing (`mode` in AC_MODES)."""
    if mode not in AC_MODES:
        raise ValueError(f"activation_checkpointing must be one of {AC_MODES}, got {mode!r}")
    if mode == "none":
        return
    context_fn = None
    if mode == "selective":
        policy = _selective_policy(_saved_ops())
        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    for block in model.model.layers:
        block.forward = functools.partial(_checkpointed, block.forward, context_fn)


def full_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights by Hugging Face-style name (RoPE tables are not weights)."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("rope_")}


def full_optimizer_state(optimizer, model: Transformer) -> dict:
    return optimizer.state_dict()


@torch.no_grad()
def load_full_state_dict(model: Transformer, weights: dict[str, torch.Tensor]) -> None:
    """Copy full weights into the model's parameters in place."""
    for name, t in weights.items():
        model.get_parameter(name).copy_(t)
