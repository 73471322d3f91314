"""Where a training run computes: the devices and process group (`Dist`), determinism, the precision
(autocast's compute dtype, the attention kernels' order) and the step's precision plan (`PrecisionPlan`:
what a step does to the weights before its first micro-batch and after each backward)."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from trainer.compute_copies import ComputeCopies
from trainer.flops import PEAKS


class Dist:
    """Rank, world size and device; initializes the process group under torchrun."""

    def __init__(self, device_pref: str = "auto"):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device_pref.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device: {device_pref} was asked for, but CUDA is not available here")
        cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
        if device_pref.startswith("cuda:"):
            self.device = torch.device(device_pref)
        elif cuda:
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.initialized_here = False
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.device.type == "cuda" else "gloo")
            self.initialized_here = True
        # host numbers (a step's loss-token count) are summed over gloo on the CPU: through NCCL they would be
        # a device tensor read back with .tolist(), a wait for everything the GPU has queued
        self.host_group = None
        if self.world > 1 and dist.get_backend() != "gloo":
            self.host_group = dist.new_group(backend="gloo")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Host numbers summed over the ranks (on the CPU, never waiting for the GPU)."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.host_group)
        return t.tolist()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        if self.initialized_here and dist.is_initialized():
            dist.destroy_process_group()


def set_determinism(enabled: bool, device: torch.device) -> None:
    if not enabled:
        return
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def compute_dtype(precision: str) -> torch.dtype | None:
    """The dtype the matmuls run in under autocast (FP8's non-FP8 ops included), or None for plain fp32."""
    return torch.bfloat16 if precision in ("bf16", "fp8-blockwise") else None


def autocast_context(precision: str, device: torch.device):
    dtype = compute_dtype(precision)
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def attention_context(device: torch.device):
    """On CUDA, SDPA backends in the order cuDNN > Flash > memory-efficient > math (cuDNN's fused
    attention is the fastest on Hopper; PyTorch's own order puts it last)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(order, set_priority=True)


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


def device_peaks(device: torch.device):
    """Dense peaks of a known GPU (for MFU), else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((p for key, p in PEAKS.items() if key in name.replace(" ", "")), None)


class PrecisionPlan:
    """What an optimizer step does to the weights around its micro-batches, one interface for every precision:
    the BF16 compute copies of the plain linears (`ComputeCopies`, cast once a step) and, under FP8, the FP8
    weight copies and Wgrad buffers (`trainer.fp8.fp8_step_context`). One process only: DDP and FSDP hook the
    weights' own gradient accumulation (and FSDP holds only shards between forwards), so there the step keeps
    autocast's casts and quantizes at every use."""

    def __init__(self, model: torch.nn.Module, precision: str, world: int, compile_adds: bool):
        dtype = compute_dtype(precision)
        self.copies = ComputeCopies(model, dtype, compile=compile_adds) if dtype and world == 1 else None
        self.fp8_stacks = None
        if precision == "fp8-blockwise" and world == 1:
            from trainer.fp8 import weight_stacks
            self.fp8_stacks = weight_stacks(model)

    def _fp8(self):
        if not self.fp8_stacks:
            return contextlib.nullcontext()
        from trainer.fp8 import stacked_weight, step_weights
        return step_weights(self.fp8_stacks, stacked_weight, grads=True)

    @contextlib.contextmanager
    def step_context(self):
        """The step's weights: the copies cast and swapped in, the FP8 weights quantized; put back on exit."""
        with self.copies.swapped() if self.copies else contextlib.nullcontext(), self._fp8():
            yield self

    def after_backward(self) -> None:
        """A micro-batch's backward has run: add its BF16 weight gradients into the fp32 masters' `.grad`."""
        if self.copies:
            self.copies.accumulate()
