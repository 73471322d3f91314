"""The FP8 forms of the model's attention and MLP, and the step's FP8 weight copies.

`trainer.model` computes q, k, v and gate, up, down as plain linears, one by one. Once their linears are
`Fp8Linear`s, `swap_fp8_modules` turns the attention and the MLP into their FP8 forms (the same module
objects, parameters and state-dict keys; only the class changes):

- `Fp8Attention`: q, k, v as ONE FP8 linear over their weights stacked along the output features, split
  back: one input quantization and one GEMM per pass instead of three, the input gradient summed inside
  the Dgrad GEMM. The parameters stay separate (HF names, checkpoints, MuonH's per-matrix
  orthogonalization and radii are unchanged). Plain BF16 linears are not stacked: the stacked form was
  1.5% slower on the H200 (benchmarks/RESULTS.md, issue 16).
- `Fp8MLP`: the whole SwiGLU MLP in one fused FP8 computation (`Fp8Linear.forward_swiglu`: gate and up as
  one stacked linear, `silu(gate) * up` inside the quantization of the down projection's input); where
  the fusion does not apply, gate and up stacked as above, then the down projection.

`step_weights(weight_stacks(model), stacked_weight, grads=True)` quantizes each stack's weight once an
optimizer step instead of once a micro-batch, with the Wgrads added into one float32 buffer a stack: the
FP8 half of the step's precision plan (`trainer.runtime.PrecisionPlan`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.fp8.linear import Fp8Linear
from trainer.model import MLP, Attention


def stacked_weight(linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The siblings' weights stacked along the output features, in their order: the one weight a stacked GEMM
    (`stacked_linears`, the fused FP8 MLP, `step_weights`) computes with."""
    return linears[0].weight if len(linears) == 1 else torch.cat([m.weight for m in linears])


def stacked_linears(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The outputs of FP8 linears that read the same input (q, k, v; gate, up), as ONE linear over their
    stacked weights, split back. Siblings of different classes (a recipe that converts only some) run one by one."""
    first = linears[0]
    if not isinstance(first, Fp8Linear) or any(type(m) is not type(first) for m in linears):
        return tuple(m(x) for m in linears)
    weight = stacked_weight(linears)
    bias = None if first.bias is None else torch.cat([m.bias for m in linears])
    return first.forward_weight(x, weight, bias).split([m.out_features for m in linears], dim=-1)


class Fp8Attention(Attention):
    """Attention whose q, k, v run as one stacked FP8 linear."""

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return stacked_linears(x, (self.q_proj, self.k_proj, self.v_proj))


class Fp8MLP(MLP):
    """SwiGLU in FP8: the down projection computes the whole MLP from the stacked gate-up weight (the SwiGLU
    product fused into its quantization); the gate projection, first of the stack, holds the step's copy."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = self.gate_proj, self.up_proj, self.down_proj
        if type(down) is type(gate):
            y = down.forward_swiglu(x, stacked_weight((gate, up)), gate)
            if y is not None:
                return y
        g, u = stacked_linears(x, (gate, up))
        return down(F.silu(g) * u)


def _all_fp8(*linears: nn.Module) -> bool:
    return all(type(m) is Fp8Linear for m in linears)


def swap_fp8_modules(model: nn.Module) -> None:
    """Give every attention whose q, k, v are all FP8, and every MLP whose gate and up are, its FP8 form."""
    for m in model.modules():
        if type(m) is Attention and _all_fp8(m.q_proj, m.k_proj, m.v_proj):
            m.__class__ = Fp8Attention
        elif type(m) is MLP and _all_fp8(m.gate_proj, m.up_proj):
            m.__class__ = Fp8MLP


def weight_stacks(model: nn.Module) -> list[tuple[nn.Linear, ...]]:
    """The weights each block GEMM of the forward computes with: a stack of siblings (q, k, v; gate, up), whose
    first linear computes for all of them where they are stacked (`stacked_weight`), or one linear (o, down).
    `step_weights` quantizes each FP8 stack once a step from this list."""
    stacks: list[tuple[nn.Linear, ...]] = []
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        stacks += [(attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,), (mlp.gate_proj, mlp.up_proj),
                   (mlp.down_proj,)]
    return stacks

