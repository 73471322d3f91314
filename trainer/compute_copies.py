"""BF16 compute copies of the fp32 master weights, cast once per optimizer step, and Wgrad accumulated
straight into fp32 gradients.

Under autocast every matmul casts its fp32 weight to BF16 when it runs, once per micro-batch, and the
backward casts each BF16 weight gradient back to fp32 before `AccumulateGrad` adds it to `.grad`: two full
passes over the weights per micro-batch besides the addition (on the H200, 1.7B, micro-batch 4: ~80 ms of
cast kernels and 94 ms of fp32 adds a step; benchmarks/RESULTS.md, issue 15). Megatron keeps a
low-precision copy of the model for the step and lets each Wgrad GEMM add into an fp32 `main_grad`
(its gradient-accumulation fusion); this is that design for one process:

- at the start of a step one foreach pass casts the masters into persistent BF16 copies, and the modules
  hold the copies until the last micro-batch's backward has run;
- the linears named `wgrad_into` (the blocks' seven) compute Wgrad as C += dy^T x with BF16 inputs and an
  fp32 C, beta = 1 (`aten.addmm.dtype_out` on CUDA: cuBLAS's fp32-output GEMM), into a persistent fp32
  buffer that becomes the master's `.grad` at the end of the step: no BF16 weight gradient, no add pass;
- the other copies (the LM head, whose gradient the chunked loss computes, and the embedding) leave a BF16
  gradient per micro-batch, and `accumulate()` adds those into the masters' fp32 `.grad`.

Only plain `nn.Linear` and `nn.Embedding` weights are copied: an FP8 linear quantizes its fp32 master itself,
and norms compute in fp32. On the CPU path (what CI runs) the Wgrad is a BF16 GEMM added in fp32, autocast's
arithmetic bit for bit; on CUDA the fp32-output GEMM skips that rounding. Under DDP or FSDP the wrappers hook
the masters, so the loop keeps autocast's casts there.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

COPIED = (nn.Linear, nn.Embedding)


@torch.library.custom_op("purokit::wgrad_into_", mutates_args=("main_grad",))
def wgrad_into_(main_grad: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> None:
    """main_grad (N, K) fp32 += dy^T (N, tokens) @ x (tokens, K), dy and x BF16."""
    if main_grad.is_cuda:
        torch.ops.aten.addmm.dtype_out(main_grad, dy.t(), x, torch.float32, beta=1, alpha=1, out=main_grad)
    else:
        main_grad.add_(dy.t() @ x)


class _LinearWgradInto(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, main_grad):
        x = x.to(weight.dtype)
        ctx.save_for_backward(x, weight, main_grad)
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, dy):
        x, weight, main_grad = ctx.saved_tensors
        wgrad_into_(main_grad, dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1]))
        return dy @ weight, None, None


class WgradIntoLinear(nn.Linear):
    """`nn.Linear` whose weight gradient, while `main_grad` is set, is added into that fp32 buffer by the
    Wgrad GEMM itself (and not returned to autograd). Same parameters and state-dict keys."""

    main_grad: torch.Tensor | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "WgradIntoLinear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.main_grad is None or self.bias is not None:
            return super().forward(x)
        return _LinearWgradInto.apply(x, self.weight, self.main_grad)


def add_into_(accumulators: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """accumulators[i] += grads[i] (fp32 += BF16)."""
    torch._foreach_add_(accumulators, grads)


def _replace_module(root: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for parent in root.modules():
        for name, child in parent.named_children():
            if child is old:
                setattr(parent, name, new)


class ComputeCopies:
    """Copies in `dtype` of `model`'s fp32 linear and embedding weights (exact types, see above).

    `wgrad_into`: bias-free linears of `model` (exact `nn.Linear`s) whose Wgrad goes into fp32 buffers; they
    are replaced in `model` by `WgradIntoLinear`s sharing their parameters. `compile`: the fp32 additions of
    the other copies as one compiled foreach kernel (eager `_foreach_add_` of mixed dtypes falls back to one
    unvectorized kernel a tensor on CUDA)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, compile: bool = False,
                 wgrad_into: Iterable[nn.Module] = ()):
        into = {id(m) for m in wgrad_into if type(m) is nn.Linear and m.bias is None and m.weight.dtype == torch.float32}
        for m in list(model.modules()):
            if id(m) in into:
                _replace_module(model, m, WgradIntoLinear.from_linear(m))
        self.slots = [m for m in model.modules()
                      if type(m) in (*COPIED, WgradIntoLinear) and m.weight.dtype == torch.float32]
        self.masters = [m.weight for m in self.slots]
        self.copies = [nn.Parameter(torch.empty_like(p, dtype=dtype),
                                    requires_grad=p.requires_grad and type(m) is not WgradIntoLinear)
                       for m, p in zip(self.slots, self.masters)]
        self.into = [(m, p, torch.zeros_like(p)) for m, p in zip(self.slots, self.masters) if type(m) is WgradIntoLinear]
        self._add_into = torch.compile(add_into_, dynamic=False, fullgraph=True) if compile else add_into_

    def __len__(self) -> int:
        return len(self.slots)

    @contextlib.contextmanager
    def swapped(self) -> Iterator["ComputeCopies"]:
        """Cast the masters into the copies and let the modules compute with them until exit; then the
        fp32 buffers become the `wgrad_into` masters' `.grad` (the masters are put back even when the
        step raises)."""
        with torch.no_grad():
            torch._foreach_copy_(self.copies, self.masters)
            if self.into:
                torch._foreach_zero_([g for _, _, g in self.into])
        for m, c in zip(self.slots, self.copies):
            m._parameters["weight"] = c
        for m, _, g in self.into:
            m.main_grad = g
        ok = False
        try:
            yield self
            ok = True
        finally:
            for m, p in zip(self.slots, self.masters):
                m._parameters["weight"] = p
            for m, p, g in self.into:
                m.main_grad = None
                if ok:
                    p.grad = g if p.grad is None else p.grad.add_(g)
            for c in self.copies:
                c.grad = None

    @torch.no_grad()
    def accumulate(self) -> None:
        """Add the copies' gradients of the micro-batch just back-propagated into the masters' fp32 `.grad`."""
        adds, grads = [], []
        for p, c in zip(self.masters, self.copies):
            if c.grad is None:
                continue
            if p.grad is None:
                p.grad = c.grad.to(p.dtype)
            else:
                adds.append(p.grad)
                grads.append(c.grad)
            c.grad = None
        if adds:
            self._add_into(adds, grads)
