"""The package's torch ops (``torch.ops.purokit_fp8.*``), defined so that a call costs little host time.

Every quantizer and GEMM of :mod:`trainer.fp8` is a torch op: ``torch.compile`` keeps it in one graph as an
opaque kernel (its fake implementation gives the shapes), and it runs as written. ``torch.library.custom_op``
would wrap each call in Python layers — an autograd kernel that re-dispatches, a frame that disables Dynamo,
an aliasing check — which took 33-43 µs a call on the H200's host (``benchmarks/RESULTS.md``, session 10):
more than the kernel of a small linear, and paid by the compiled loop too, whose graphs call the ops through
the dispatcher. These ops need no autograd (they run inside the FP8 linears' autograd Functions), so they are
defined with torch.library's lower-level API instead: the schema inferred from the annotations as
``custom_op`` infers it, the function registered for every backend, a fake implementation for tracing.
"""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "purokit_fp8"
_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")


class Op:
    """A defined op: calling it dispatches ``torch.ops.purokit_fp8.<name>``; ``impl`` is the function itself."""

    def __init__(self, name: str, impl: Callable):
        self.name, self.impl = name, impl
        self._overload = getattr(getattr(torch.ops, NAMESPACE), name).default
        self.__doc__ = impl.__doc__

    def __call__(self, *args, **kwargs):
        return self._overload(*args, **kwargs)

    def register_fake(self, fake: Callable) -> Callable:
        """Decorator: the shape-only implementation used under tracing (FakeTensor mode)."""
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", fake, lib=_LIB)
        return fake


def op(name: str, mutates_args: tuple[str, ...] = ()) -> Callable[[Callable], Op]:
    """Decorator: define ``purokit_fp8::<name>`` from a type-annotated function, which becomes its kernel on
    every device (``mutates_args``: the tensor arguments it writes in place, as ``custom_op`` takes them)."""

    def define(fn: Callable) -> Op:
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        return Op(name, fn)

    return define
