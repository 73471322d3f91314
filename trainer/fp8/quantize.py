"""Blockwise E4M3 quantization in plain torch ops: the reference for every other implementation.

Puro §3.2 (DeepSeek-V3 recipe): activations and activation gradients get one scale per 1x128 group
of consecutive values along the GEMM reduction dimension, weights one scale per 128x128 block.
A scale ``s`` is a *decoding* factor: ``x ≈ q * s`` with ``q`` in float8_e4m3fn, ``|q| <= 448``.

Scale formats:

- ``pow2``: ``s = 2**ceil(log2(amax / 448))``, the smallest power of two with ``amax / s <= 448``.
  It is computed exactly from the bits of ``amax`` (no log2 rounding): with ``amax = 1.f * 2**e``,
  ``s = 2**(e - 8)`` when ``1.f <= 1.75`` and ``2**(e - 7)`` otherwise, because ``448 = 1.75 * 2**8``.
  Multiplying by ``1/s`` is then exact, so the only error is E4M3's rounding (relative <= 2**-4 for
  values that land in E4M3's normal range).
- ``fp32``: ``s = amax / 448`` (the full range is used; the scale itself is rounded).

These functions are what the ``emulate`` backend runs, and they are written so that ``torch.compile``
can fuse them into the op that produced ``x`` (Ring-linear §0: linghe fuses quantization into the
preceding RMSNorm/SiLU). Groups that do not fill 128 values (a dimension not divisible by 128) are
padded with zeros, which change no amax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.fp8.ops import op
from trainer.fp8.recipe import E4M3_MAX, GROUP

FP8_DTYPE = torch.float8_e4m3fn
AMAX_FLOOR = 2.0**-64
"""All-zero groups get the scale of this amax, so that ``1/s`` stays finite and ``q = 0``."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scales_from_amax(amax: torch.Tensor, scale_format: str = "pow2") -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding scale ``s`` and encoding factor ``1/s`` (both float32) for each group's ``amax``.

    ``pow2``: exact powers of two from the exponent/mantissa bits (see module docstring).
    ``fp32``: ``s = amax/448``.
    """
    amax = amax.float().clamp_min(AMAX_FLOOR)
    if scale_format == "pow2":
        bits = amax.view(torch.int32)
        exponent = (bits >> 23) & 0xFF
        mantissa_over_175 = ((bits & 0x7FFFFF) > 0x600000).to(torch.int32)  # 1.f > 1.75
        e = exponent - (127 + 8) + mantissa_over_175  # unbiased exponent of s
        scale = ((e + 127) << 23).view(torch.float32)
        inv_scale = ((127 - e) << 23).view(torch.float32)
        return scale, inv_scale
    if scale_format == "fp32":
        # tensor/tensor true divisions: a Python-scalar operand would become a multiplication by a
        # reciprocal on some devices; this way every implementation (Triton's ieee div too) agrees
        e4m3_max = torch.full_like(amax, E4M3_MAX)
        return amax / e4m3_max, e4m3_max / amax
    raise ValueError(f"unknown scale_format {scale_format!r}: expected 'pow2' or 'fp32'")


def _encode(x: torch.Tensor, inv_scale: torch.Tensor) -> torch.Tensor:
    return (x * inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)


def quantize_1x128(x: torch.Tensor, scale_format: str = "pow2") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D ``x`` (R, C) with one scale per 1x128 group along its last dimension.

    Returns ``q`` (R, C) float8_e4m3fn and ``s`` (R, ceil(C/128)) float32, so that
    ``x[r, c] ≈ q[r, c] * s[r, c // 128]``. Use it on ``x`` for Fprop (groups along K), on ``dy`` for
    Dgrad (groups along N) and on the transposes ``x.t()`` / ``dy.t()`` for Wgrad (groups along tokens).
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_1x128 expects a 2-D tensor, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    groups = ceil_div(cols, GROUP)
    # contiguous first: for x = y.t() this is the transposing copy (in x's dtype), and it makes q
    # row-major, which cuBLAS needs for the A operand
    xc = x.contiguous()
    if cols % GROUP:
        xc = F.pad(xc, (0, groups * GROUP - cols))
    xg = xc.reshape(rows, groups, GROUP)
    scale, inv_scale = scales_from_amax(xg.abs().amax(dim=-1), scale_format)  # amax is exact in any dtype
    q = _encode(xg.float(), inv_scale.unsqueeze(-1)).reshape(rows, groups * GROUP)
    if cols % GROUP:
        q = q[:, :cols].contiguous()
    return q, scale


def quantize_128x128(w: torch.Tensor, scale_format: str = "pow2") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a weight ``w`` (N, K) with one scale per 128x128 block.

    Returns ``q`` (N, K) float8_e4m3fn and ``s`` (ceil(N/128), ceil(K/128)) float32, so that
    ``w[n, k] ≈ q[n, k] * s[n // 128, k // 128]``. A 128x128 block is square, so ``q.t()`` with
    ``s.t()`` is exactly the blockwise quantization of ``w.t()`` (what Dgrad multiplies by).
    """
    if w.dim() != 2:
        raise ValueError(f"quantize_128x128 expects a 2-D tensor, got shape {tuple(w.shape)}")
    n, k = w.shape
    nb, kb = ceil_div(n, GROUP), ceil_div(k, GROUP)
    wc = w.contiguous()
    if n % GROUP or k % GROUP:
        wc = F.pad(wc, (0, kb * GROUP - k, 0, nb * GROUP - n))
    wb = wc.reshape(nb, GROUP, kb, GROUP)
    scale, inv_scale = scales_from_amax(wb.abs().amax(dim=(1, 3)), scale_format)
    q = _encode(wb.float(), inv_scale[:, None, :, None]).reshape(nb * GROUP, kb * GROUP)
    if n % GROUP or k % GROUP:
        q = q[:n, :k].contiguous()
    return q, scale


# The ``emulate`` backend's quantizations as one op Inductor does not look into. Inductor's CPU code generation
# failed on them inside a compiled block wherever a dimension is not a multiple of 128 (an assertion while
# splitting the padded group loop), and with some graphs produced NaN instead of failing. The emulation is the
# reference, so it runs as written, eager, inside compiled graphs. The ``torch`` quantizer on CUDA still calls
# the functions above, which Inductor fuses into their producers.


@op("emulate_quantize", mutates_args=())
def emulate_quantize(x: torch.Tensor, scale_format: str, block_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_1x128` (``block_rows`` 1) or :func:`quantize_128x128` (128) as one opaque op."""
    return (quantize_1x128 if block_rows == 1 else quantize_128x128)(x, scale_format)


@emulate_quantize.register_fake
def _(x, scale_format, block_rows):
    rows, cols = x.shape
    return (x.new_empty((rows, cols), dtype=FP8_DTYPE),
            x.new_empty((ceil_div(rows, block_rows), ceil_div(cols, GROUP)), dtype=torch.float32))


def dequantize_1x128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_1x128` in float32 (exact: E4M3 values times powers of two fit)."""
    rows, cols = q.shape
    expanded = s.float().repeat_interleave(GROUP, dim=1)[:, :cols]
    return q.float() * expanded


def dequantize_128x128(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_128x128` in float32."""
    n, k = q.shape
    expanded = s.float().repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)[:n, :k]
    return q.float() * expanded


def colmajor(s: torch.Tensor) -> torch.Tensor:
    """The same (rows, groups) scales as a column-major tensor (strides (1, rows))."""
    rows, cols = s.shape
    if s.stride(0) == 1 and (cols == 1 or s.stride(1) == rows):
        return s
    return s.t().contiguous().t()
