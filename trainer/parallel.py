"""Around the model, not in it (the torchtitan split): activation checkpointing, FSDP2, and how the
full weights and optimizer state are gathered for a checkpoint (and sharded again on resume).

FSDP2 (`parallel.data: fsdp`, under torchrun): `fully_shard` on every block, then on the loss module
as the root (the embedding, final norm and LM head), over one mesh of all ranks; parameters are fp32
row shards, gathered in BF16 for compute on CUDA (reduce in fp32). Gradients are reduce-scattered
only on the last micro-batch of a step. Checkpoints hold full tensors, the same files as DDP runs
write, so a run may change between DDP and FSDP when it resumes. MuonH's Newton-Schulz needs whole
matrices: `trainer.optim` gathers them and splits the Newton-Schulz work over the ranks.

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


def apply_fsdp(loss_model: torch.nn.Module, model: Transformer, device: torch.device,
               precision: str) -> torch.nn.Module:
    """Shard `model`'s blocks and then `loss_model` (the root) over all ranks with FSDP2."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    mp = MixedPrecisionPolicy()
    if device.type == "cuda" and precision in ("bf16", "fp8-blockwise"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(loss_model, mesh=mesh, mp_policy=mp)
    return loss_model


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's full weights by Hugging Face-style name (RoPE tables are not weights). Under
    FSDP2 every rank must call it (the shards are all-gathered)."""
    return {k: _full(v) for k, v in model.state_dict().items() if not k.startswith("rope_")}


def full_optimizer_state(optimizer, model: Transformer) -> dict:
    """The optimizer's state dict with full tensors (every rank calls it under FSDP2)."""
    out = {}
    for part, sd in optimizer.state_dict().items():
        out[part] = {"state": {i: {k: _full(v) for k, v in st.items()} for i, st in sd["state"].items()},
                     "param_groups": sd["param_groups"]}
    return out


def shard_optimizer_state(state: dict, optimizer) -> dict:
    """A full optimizer state dict (a checkpoint's) cut to this rank's shards where the optimizer's
    parameters are FSDP2 shards and its state is per element (AdamW's moments); MuonH's state stays
    whole (its momentum is kept as full matrices)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for part, sd in state.items():
        opt = optimizer.optimizers.get(part)
        params = [p for g in opt.param_groups for p in g["params"]] if opt is not None else []
        new_state = {}
        for i, st in sd["state"].items():
            p = params[int(i)] if int(i) < len(params) else None
            if part == "matrix" or not isinstance(p, DTensor):
                new_state[i] = st
                continue
            rank, world = p.device_mesh.get_local_rank(), p.device_mesh.size()
            new_state[i] = {k: DTensor.from_local(v.chunk(world, dim=0)[rank].contiguous().to(p.to_local().device),
                                                  p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
                            if isinstance(v, torch.Tensor) and v.shape == p.shape else v for k, v in st.items()}
        out[part] = {"state": new_state, "param_groups": sd["param_groups"]}
    return out


@torch.no_grad()
def load_full_state_dict(model: Transformer, weights: dict[str, torch.Tensor]) -> None:
    """Copy full weights into the model's parameters in place (this rank's rows of FSDP2 shards)."""
    from trainer.optim import write_full_

    for name, t in weights.items():
        write_full_(model.get_parameter(name), t)
