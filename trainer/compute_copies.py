"""BF16 compute copies of the fp32 master weights, cast once per optimizer step.

Under autocast every matmul casts its fp32 weight to BF16 when it runs, once per micro-batch, and the
backward casts each BF16 weight gradient back to fp32 before `AccumulateGrad` adds it to `.grad`: two full
passes over the weights per micro-batch besides the addition (on the H200, 1.7B, micro-batch 4: ~80 ms of
cast kernels and 94 ms of fp32 adds a step; benchmarks/RESULTS.md, issue 15). Megatron and Apex keep a
low-precision copy of the model for the step instead; this is that design for one process:

- at the start of a step one foreach pass casts the masters into persistent BF16 copies, and the modules
  hold the copies until the last micro-batch's backward has run;
- the backward leaves each micro-batch's BF16 weight gradient on the copies, and `accumulate()` adds them
  into the masters' fp32 `.grad` in one pass (the first micro-batch's is cast, not added, into a persistent
  fp32 buffer that serves as `.grad` every step).

The arithmetic is autocast's: the same BF16 weights enter the same kernels, and each micro-batch's weight
gradient is rounded to BF16 (the GEMM's output dtype) before it is summed in fp32. Only plain `nn.Linear`
weights are copied: an FP8 linear quantizes its fp32 master itself, norms compute in fp32, and the embedding
keeps its fp32 gather and gradient. Under DDP or FSDP the wrappers hook the masters, so the loop keeps autocast's casts there.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn

def add_into_(accumulators: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """accumulators[i] += grads[i] (fp32 += BF16)."""
    torch._foreach_add_(accumulators, grads)


class ComputeCopies:
    """Copies in `dtype` of `model`'s fp32 linear weights (exact `nn.Linear`s, see above).

    `compile`: the fp32 additions as one compiled foreach kernel (on CUDA: eager `_foreach_add_` of mixed
    dtypes falls back to one unvectorized kernel a tensor, 130 ms a step at 1.7B / micro-batch 4 on the
    H200 against ~94 ms for fp32 + fp32). On CUDA the additions run on a side stream, beside the next
    micro-batch's forward (memory-bound adds under compute-bound GEMMs); leaving `swapped()` waits for them."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, compile: bool = False):
        # exact nn.Linear: not an FP8 linear, and not the embedding (CUDA's BF16 embedding backward left its gradient
        # 1% off autocast's, relative norm, on the H200, where every linear's copy is within BF16's rounding)
        self.slots = [m for m in model.modules() if type(m) is nn.Linear and m.weight.dtype == torch.float32]
        self.masters = [m.weight for m in self.slots]
        self.copies = [nn.Parameter(torch.empty_like(p, dtype=dtype), requires_grad=p.requires_grad)
                       for p in self.masters]
        self.grad_buffers: list[torch.Tensor | None] = [None] * len(self.masters)   # fp32 .grad, see accumulate
        self._add_into = torch.compile(add_into_, dynamic=False, fullgraph=True) if compile else add_into_
        on_cuda = bool(self.masters) and self.masters[0].is_cuda
        self.stream = torch.cuda.Stream(device=self.masters[0].device) if on_cuda else None

    def __len__(self) -> int:
        return len(self.slots)

    @contextlib.contextmanager
    def swapped(self) -> Iterator["ComputeCopies"]:
        """Cast the masters into the copies and let the modules compute with them until exit (the
        masters are put back even when the step raises)."""
        with torch.no_grad():
            torch._foreach_copy_(self.copies, self.masters)
        for m, c in zip(self.slots, self.copies):
            m._parameters["weight"] = c
        try:
            yield self
        finally:
            if self.stream is not None:
                torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
            for m, p in zip(self.slots, self.masters):
                m._parameters["weight"] = p
            for c in self.copies:
                c.grad = None

    @torch.no_grad()
    def accumulate(self) -> None:
        """Add the copies' gradients of the micro-batch just back-propagated into the masters' fp32 `.grad`.

        A master whose `.grad` is None (the step's first gradient) gets its persistent fp32 buffer as `.grad`,
        filled by a cast. The buffers are allocated once and never freed: a `.grad` allocated each step and
        freed by `zero_grad(set_to_none=True)` after being written on the side stream would wait for that
        stream before its memory is reused, and with the host a step ahead of the GPU (the loop reads each
        step's loss one step late) a second generation of fp32 gradients would be allocated meanwhile."""
        casts, cast_from, adds, grads = [], [], [], []
        for i, (p, c) in enumerate(zip(self.masters, self.copies)):
            if c.grad is None:
                continue
            if p.grad is None:
                if self.grad_buffers[i] is None:
                    self.grad_buffers[i] = torch.empty_like(p)
                p.grad = self.grad_buffers[i]
                casts.append(p.grad)
                cast_from.append(c.grad)
            else:
                adds.append(p.grad)
                grads.append(c.grad)
            c.grad = None
        if not casts and not adds:
            return
        stream = self.stream
        if stream is not None:
            # the side stream starts after the backward that made the gradients (and after the optimizer step that
            # last read the buffers); the BF16 gradients are recorded on it so their memory waits for the reads
            stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if casts:
                torch._foreach_copy_(casts, cast_from)
            if adds:
                self._add_into(adds, grads)
        if stream is not None:
            for g in cast_from + grads:
                g.record_stream(stream)
