"""Triton quantization kernels for the CUDA path (Hopper), registered as torch custom ops.

Two kernels, both bandwidth-bound, both computing scales exactly as :mod:`trainer.fp8.quantize`
(bit-identical outputs for ``pow2``; the GPU tests check that):

- ``quant_act``: one program reads one 128x128 tile of a token-major activation or gradient
  (M, K) once and writes (a) the row copy ``q`` (M, K) with one scale per 1x128 group along K
  (Fprop's A operand, or Dgrad's A operand when the input is ``dy``), and (b) the transposed copy
  ``qt`` (K, M_pad) with one scale per 1x128 group along the tokens (Wgrad's operands). Reading the
  input once for both copies is the fusion that pays here: quantization is memory-bound, and the
  transposed copy otherwise costs a second full read.
- ``quant_weight``: one program per 128x128 block of a weight (N, K) writes ``q`` (N, K) and its
  transpose ``qt`` (K, N) with the block's single scale (a square block's scale serves both).

Scales are written straight into the column-major layouts that ``F.scaled_mm`` demands, so no
transposing copy is launched afterwards. ``M_pad`` rounds the token count up to 128: rows past ``M``
are zero in ``qt`` and contribute nothing to Wgrad.

Triton is imported lazily, so this module imports (and the ops register) on CPU-only machines.
"""

from __future__ import annotations

import torch

from trainer.fp8.quantize import FP8_DTYPE, ceil_div
from trainer.fp8.recipe import GROUP

_NS = "purokit_fp8"


try:  # Triton is optional: absent on CPU-only installs
    import triton
    import triton.language as tl

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def triton_available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _scales(amax, POW2: tl.constexpr):
        amax = tl.maximum(amax, 5.421010862427522e-20)  # AMAX_FLOOR = 2**-64
        if POW2:
            bits = amax.to(tl.int32, bitcast=True)
            exponent = (bits >> 23) & 0xFF
            over = ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
            e = exponent - 135 + over
            scale = ((e + 127) << 23).to(tl.float32, bitcast=True)
            inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
        else:
            e4m3_max = 448.0 + tl.zeros_like(amax)
            scale = tl.math.div_rn(amax, e4m3_max)  # correctly rounded, as torch's tensor division
            inv = tl.math.div_rn(e4m3_max, amax)
        return scale, inv

    @triton.jit
    def _act_kernel(
        x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, M_pad, stride_xm,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        rm = pid_m * BLOCK + tl.arange(0, BLOCK)
        rk = pid_k * BLOCK + tl.arange(0, BLOCK)
        in_rows = rm < M
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=in_rows[:, None], other=0.0)
        x = x.to(tl.float32)
        ax = tl.abs(x)
        if WRITE_ROW:
            s_r, inv_r = _scales(tl.max(ax, axis=1), POW2)
            q = tl.clamp(x * inv_r[:, None], -448.0, 448.0).to(tl.float8e4nv)
            tl.store(q_ptr + rm[:, None] * K + rk[None, :], q, mask=in_rows[:, None])
            # s storage is (K/128, M): the (M, K/128) column-major operand scaled_mm wants
            tl.store(s_ptr + pid_k * M + rm, s_r, mask=in_rows)
        if WRITE_T:
            s_c, inv_c = _scales(tl.max(ax, axis=0), POW2)
            # transpose in float32, then cast (keeps 8-bit layouts out of the shared-memory transpose)
            qc = tl.trans(tl.clamp(x * inv_c[None, :], -448.0, 448.0)).to(tl.float8e4nv)
            tl.store(qt_ptr + rk[:, None] * M_pad + rm[None, :], qc)
            # st storage is (M_pad/128, K): the (K, M_pad/128) column-major operand
            tl.store(st_ptr + pid_m * K + rk, s_c)

    @triton.jit
    def _weight_kernel(
        w_ptr, q_ptr, qt_ptr, s_ptr, N, K, KB,
        POW2: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        rn = pid_n * BLOCK + tl.arange(0, BLOCK)
        rk = pid_k * BLOCK + tl.arange(0, BLOCK)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :]).to(tl.float32)
        amax = tl.max(tl.max(tl.abs(w), axis=1), axis=0)
        s, inv = _scales(amax, POW2)
        q = tl.clamp(w * inv, -448.0, 448.0).to(tl.float8e4nv)
        tl.store(q_ptr + rn[:, None] * K + rk[None, :], q)
        if WRITE_T:
            # the transposed copy re-reads the block with transposed indexing (an L2 hit) instead of
            # tl.trans: with float32 inputs, tl.trans here produced a wrong transpose on Triton 3.6
            wt = tl.load(w_ptr + rn[None, :] * K + rk[:, None]).to(tl.float32)
            qt = tl.clamp(wt * inv, -448.0, 448.0).to(tl.float8e4nv)
            tl.store(qt_ptr + rk[:, None] * N + rn[None, :], qt)
        tl.store(s_ptr + pid_n * KB + pid_k, s)


def _require_triton() -> None:
    if triton is None:
        raise RuntimeError(f"the Triton quantizer needs Triton, which did not import ({_TRITON_IMPORT_ERROR})")


def _check_k(name: str, k: int) -> None:
    if k % GROUP:
        raise ValueError(f"{name}: the reduction dimension ({k}) must be a multiple of {GROUP} on the CUDA path")


@torch.library.custom_op(f"{_NS}::quant_act", mutates_args=())
def _quant_act_op(
    x: torch.Tensor, pow2: bool, write_row: bool, write_t: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = x.shape
    _check_k("quant_act", k)
    if x.stride(1) != 1:
        x = x.contiguous()
    m_pad = ceil_div(m, GROUP) * GROUP
    dev = x.device
    q = torch.empty((m, k) if write_row else (0, k), dtype=FP8_DTYPE, device=dev)
    s_store = torch.empty((k // GROUP, m) if write_row else (0, m), dtype=torch.float32, device=dev)
    qt = torch.empty((k, m_pad) if write_t else (0, m_pad), dtype=FP8_DTYPE, device=dev)
    st_store = torch.empty((m_pad // GROUP, k) if write_t else (0, k), dtype=torch.float32, device=dev)
    if m > 0 and (write_row or write_t):
        _require_triton()
        grid = (m_pad // GROUP, k // GROUP)
        _act_kernel[grid](
            x, q, s_store, qt, st_store, m, k, m_pad, x.stride(0),
            POW2=pow2, WRITE_ROW=write_row, WRITE_T=write_t, BLOCK=GROUP, num_warps=8,
        )
    return q, s_store, qt, st_store


@_quant_act_op.register_fake
def _(x, pow2, write_row, write_t):
    m, k = x.shape
    m_pad = ceil_div(m, GROUP) * GROUP
    q = x.new_empty((m, k) if write_row else (0, k), dtype=FP8_DTYPE)
    s_store = x.new_empty((k // GROUP, m) if write_row else (0, m), dtype=torch.float32)
    qt = x.new_empty((k, m_pad) if write_t else (0, m_pad), dtype=FP8_DTYPE)
    st_store = x.new_empty((m_pad // GROUP, k) if write_t else (0, k), dtype=torch.float32)
    return q, s_store, qt, st_store


def quant_act(
    x: torch.Tensor, pow2: bool, write_row: bool = True, write_t: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and transposed blockwise quantization of a 2-D (M, K) CUDA tensor in one pass.

    Returns ``q`` (M, K), ``s`` (M, K/128) column-major, ``qt`` (K, M_pad), ``st`` (K, M_pad/128)
    column-major; outputs not asked for are empty tensors. The op returns the scale storages
    (contiguous); the transposed views are taken here, outside the op.
    """
    q, s_store, qt, st_store = _quant_act_op(x, pow2, write_row, write_t)
    return q, s_store.t(), qt, st_store.t()


@torch.library.custom_op(f"{_NS}::quant_weight", mutates_args=())
def quant_weight(w: torch.Tensor, pow2: bool, write_t: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """128x128 blockwise quantization of a CUDA weight (N, K): ``q`` (N, K), ``qt`` (K, N) (empty
    unless ``write_t``) and the block scales ``s`` (N/128, K/128), row-major."""
    n, k = w.shape
    _check_k("quant_weight", k)
    _check_k("quant_weight (out features)", n)
    w = w.contiguous()
    q = torch.empty((n, k), dtype=FP8_DTYPE, device=w.device)
    qt = torch.empty((k, n) if write_t else (0, n), dtype=FP8_DTYPE, device=w.device)
    s = torch.empty((n // GROUP, k // GROUP), dtype=torch.float32, device=w.device)
    _require_triton()
    _weight_kernel[(n // GROUP, k // GROUP)](
        w, q, qt, s, n, k, k // GROUP, POW2=pow2, WRITE_T=write_t, BLOCK=GROUP, num_warps=8
    )
    return q, qt, s


@quant_weight.register_fake
def _(w, pow2, write_t):
    n, k = w.shape
    q = w.new_empty((n, k), dtype=FP8_DTYPE)
    qt = w.new_empty((k, n) if write_t else (0, n), dtype=FP8_DTYPE)
    s = w.new_empty((n // GROUP, k // GROUP), dtype=torch.float32)
    return q, qt, s
