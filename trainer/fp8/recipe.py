"""The blockwise FP8 recipe as a typed config (Puro §3.2, DeepSeek-V3 style).

What is fixed by the recipe and not configurable: E4M3 operands for Fprop, Dgrad and Wgrad; FP32
accumulation; activations and activation gradients scaled per 1x128 group along each GEMM's reduction
dimension; weights scaled per 128x128 block; the quantized input kept (in FP8) for Wgrad; core
attention, embeddings, the LM head and norms untouched (the converter only swaps linears).

What is configurable:

- ``scale_format``: ``pow2`` (default; every scale an exact power of two, the exponent-only E8M0
  expressiveness Puro uses) or ``fp32`` (scale = amax / 448, DeepSeek-V3 on Hopper).
- ``backend``: ``cuda-scaled-mm`` runs the three GEMMs through ``torch.nn.functional.scaled_mm`` with
  ``BlockWise1x128`` / ``BlockWise128x128`` scaling (cuBLAS on Hopper); ``emulate`` quantizes exactly
  the same way, dequantizes and multiplies in FP32 (any device; what CI tests); ``auto`` picks
  ``cuda-scaled-mm`` for CUDA tensors when the device passes a one-time probe, else ``emulate``.
- ``quantizer``: the fused kernels, in which one read of a 128x128 tile writes both the row-quantized
  copy and the transposed column-quantized copy that Wgrad needs: ``cuda`` (``trainer/fp8/csrc/quantize.cu``,
  built into the GEMM library; BF16 activations) or ``triton``; ``torch`` (the same math in plain torch
  ops, which ``torch.compile`` fuses into the neighbouring ops and de-duplicates across q/k/v); or
  ``auto`` (default: per call, ``cuda`` where it takes the input, else ``triton``; ``torch`` when Triton
  is not importable). Weights are quantized by the Triton kernel for all three fused settings.
- ``gemm``: which library runs the blockwise GEMMs on the CUDA backend: ``cublas`` (``F.scaled_mm``),
  ``cutlass`` (the Hopper kernels of ``trainer/fp8/csrc``, built ahead: :mod:`trainer.fp8.cutlass_gemm`),
  or ``auto`` (default): per GEMM shape, what the measured table ``trainer/fp8/gemm_table.json`` says is
  fastest on this device, cuBLAS where it has no entry or the CUTLASS library is absent.
- ``exclude``: regular expressions over qualified module names that stay in high precision. The
  default keeps the LM head (``lm_head``, ``output``, ``head``) in BF16; embeddings and norms are not
  ``nn.Linear`` and are never touched.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from purokit.config import StrictModel

E4M3_MAX = 448.0
"""Largest finite magnitude of float8_e4m3fn."""

GROUP = 128
"""Group length of activation/gradient scales (1x128) and side of weight blocks (128x128)."""

DEFAULT_EXCLUDE = (r"(^|\.)lm_head$", r"(^|\.)output$", r"(^|\.)head$")

ScaleFormat = Literal["pow2", "fp32"]
Backend = Literal["auto", "cuda-scaled-mm", "emulate"]
Quantizer = Literal["auto", "cuda", "triton", "torch"]
Gemm = Literal["auto", "cublas", "cutlass"]


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression {pattern!r}: {exc}") from None


class Fp8Recipe(StrictModel):
    """Blockwise FP8 recipe (Puro §3.2). ``Fp8Recipe()`` is the Puro default."""

    model_config = ConfigDict(frozen=True)         # extra="forbid" from StrictModel

    schema_version: Literal[1] = 1
    scale_format: ScaleFormat = "pow2"
    backend: Backend = "auto"
    quantizer: Quantizer = "auto"
    gemm: Gemm = "auto"
    exclude: tuple[str, ...] = Field(default=DEFAULT_EXCLUDE)
    include: str | None = Field(
        default=None, description="if set, only linears whose qualified name matches this regex are converted"
    )

    @field_validator("exclude", mode="before")
    @classmethod
    def _exclude_tuple(cls, v: object) -> object:
        if isinstance(v, str):
            return (v,)
        if isinstance(v, list):
            return tuple(v)
        return v

    @field_validator("exclude")
    @classmethod
    def _exclude_compiles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            _compile(pattern)
        return v

    @field_validator("include")
    @classmethod
    def _include_compiles(cls, v: str | None) -> str | None:
        if v is not None:
            _compile(v)
        return v

    def wants(self, qualified_name: str) -> bool:
        """Whether the linear at ``qualified_name`` is converted under this recipe."""
        if any(re.search(p, qualified_name) for p in self.exclude):
            return False
        return self.include is None or re.search(self.include, qualified_name) is not None
