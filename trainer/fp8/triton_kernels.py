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
    from triton.language.extra import libdevice

    _TRITON_IMPORT_ERROR: str | None = None
except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
    triton = None
    tl = None
    libdevice = None
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
    def _quant_store(
        x, rm, rk, kb, mb, M, K, M_pad, q_ptr, s_ptr, qt_ptr, st_ptr,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr,
    ):
        """Quantize one float32 128x128 tile ``x`` (rows ``rm`` of M tokens, columns ``rk`` of a K-wide
        output; ``kb``/``mb`` its column/row block) into the row copy and the transposed copy."""
        in_rows = rm < M
        ax = tl.abs(x)
        if WRITE_ROW:
            s_r, inv_r = _scales(tl.max(ax, axis=1), POW2)
            q = tl.clamp(x * inv_r[:, None], -448.0, 448.0).to(tl.float8e4nv)
            tl.store(q_ptr + rm[:, None] * K + rk[None, :], q, mask=in_rows[:, None])
            # s storage is (K/128, M): the (M, K/128) column-major operand scaled_mm wants
            tl.store(s_ptr + kb * M + rm, s_r, mask=in_rows)
        if WRITE_T:
            s_c, inv_c = _scales(tl.max(ax, axis=0), POW2)
            # transpose in float32, then cast (keeps 8-bit layouts out of the shared-memory transpose)
            qc = tl.trans(tl.clamp(x * inv_c[None, :], -448.0, 448.0)).to(tl.float8e4nv)
            tl.store(qt_ptr + rk[:, None] * M_pad + rm[None, :], qc)
            # st storage is (M_pad/128, K): the (K, M_pad/128) column-major operand
            tl.store(st_ptr + mb * K + rk, s_c)

    @triton.jit
    def _act_kernel(
        x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, M_pad, stride_xm,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
        TILES: tl.constexpr,
    ):
        """One program quantizes TILES tiles of one 128-row band, side by side along K; the next tile
        is loaded before the current one is quantized, so its read overlaps the arithmetic and the
        stores (a program with one tile waits for its load, then computes with no load in flight)."""
        pid_m = tl.program_id(0)
        kb0 = tl.program_id(1) * TILES
        rm = pid_m * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, BLOCK)
        in_rows = rm < M
        rows = x_ptr + rm[:, None] * stride_xm
        x = tl.load(rows + (kb0 * BLOCK + cols)[None, :], mask=in_rows[:, None], other=0.0)
        for t in tl.static_range(TILES):
            if t + 1 < TILES:
                x_next = tl.load(rows + ((kb0 + t + 1) * BLOCK + cols)[None, :], mask=in_rows[:, None], other=0.0)
            _quant_store(x.to(tl.float32), rm, (kb0 + t) * BLOCK + cols, kb0 + t, pid_m, M, K, M_pad,
                         q_ptr, s_ptr, qt_ptr, st_ptr, POW2, WRITE_ROW, WRITE_T)
            if t + 1 < TILES:
                x = x_next

    @triton.jit
    def _silu_parts(g):
        """silu(g) and sigmoid(g) in float32 as torch's CUDA kernels compute them (accurate expf,
        correctly rounded division), so that the fused kernels round like eager torch."""
        e = libdevice.exp(-g)
        sig = tl.math.div_rn(1.0 + tl.zeros_like(g), 1.0 + e)
        return tl.math.div_rn(g, 1.0 + e), sig

    @triton.jit
    def _bf16(x):
        return x.to(tl.bfloat16).to(tl.float32)

    @triton.jit
    def _swiglu_kernel(
        gu_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, M_pad, stride_gm,
        POW2: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """h = silu(gate) * up from the stacked (M, 2F) gate-up output, quantized for the down
        projection: h is never written in BF16."""
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        rm = pid_m * BLOCK + tl.arange(0, BLOCK)
        rk = pid_k * BLOCK + tl.arange(0, BLOCK)
        rows = rm[:, None] < M
        base = gu_ptr + rm[:, None] * stride_gm + rk[None, :]
        g = tl.load(base, mask=rows, other=0.0).to(tl.float32)
        u = tl.load(base + F, mask=rows, other=0.0).to(tl.float32)
        silu, _ = _silu_parts(g)
        h = _bf16(_bf16(silu) * u)  # eager torch: silu(g) in BF16, times up, in BF16
        _quant_store(h, rm, rk, pid_k, pid_m, M, F, M_pad, q_ptr, s_ptr, qt_ptr, st_ptr, POW2, True, WRITE_T)

    @triton.jit
    def _swiglu_bwd_kernel(
        gu_ptr, dh_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, M_pad, stride_gm, stride_dm,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """d(gate), d(up) of h = silu(gate) * up, written straight as the quantized output gradient
        (M, 2F) of the stacked gate-up linear: row copy for its Dgrad, transposed copy for its Wgrad."""
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        rm = pid_m * BLOCK + tl.arange(0, BLOCK)
        rk = pid_k * BLOCK + tl.arange(0, BLOCK)
        rows = rm[:, None] < M
        base = gu_ptr + rm[:, None] * stride_gm + rk[None, :]
        g = tl.load(base, mask=rows, other=0.0).to(tl.float32)
        u = tl.load(base + F, mask=rows, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + rm[:, None] * stride_dm + rk[None, :], mask=rows, other=0.0).to(tl.float32)
        silu, sig = _silu_parts(g)
        # eager torch's autograd of silu(g) * up in BF16: d(up) = dh * silu(g); d(silu) = dh * up, then
        # silu_backward: d(silu) * sig * (1 + g (1 - sig))
        dg = _bf16(_bf16(dh * u) * sig * (1.0 + g * (1.0 - sig)))
        _quant_store(dg, rm, rk, pid_k, pid_m, M, 2 * F, M_pad, q_ptr, s_ptr, qt_ptr, st_ptr,
                     POW2, WRITE_ROW, WRITE_T)
        du = _bf16(dh * _bf16(silu))
        _quant_store(du, rm, rk + F, pid_k + F // BLOCK, pid_m, M, 2 * F, M_pad, q_ptr, s_ptr, qt_ptr, st_ptr,
                     POW2, WRITE_ROW, WRITE_T)

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


def _act_outputs(x: torch.Tensor, m: int, k: int, write_row: bool, write_t: bool):
    """Empty outputs of a (m, k) activation quantization (copies not asked for have no rows):
    ``q`` (m, k), ``s`` storage (k/128, m), ``qt`` (k, m_pad), ``st`` storage (m_pad/128, k)."""
    m_pad = ceil_div(m, GROUP) * GROUP
    q = x.new_empty((m, k) if write_row else (0, k), dtype=FP8_DTYPE)
    s_store = x.new_empty((k // GROUP, m) if write_row else (0, m), dtype=torch.float32)
    qt = x.new_empty((k, m_pad) if write_t else (0, m_pad), dtype=FP8_DTYPE)
    st_store = x.new_empty((m_pad // GROUP, k) if write_t else (0, k), dtype=torch.float32)
    return q, s_store, qt, st_store


# (tiles a program, warps) of the activation quantizer; ACT_TILES tiles where K allows (benchmarks/fp8_gemm.py
# --quant-sweep measures the choices)
ACT_TILES, ACT_WARPS = 1, 8


def act_launch(k: int, tiles: int | None = None, warps: int | None = None) -> tuple[int, int]:
    t = ACT_TILES if tiles is None else tiles
    while (k // GROUP) % t:
        t //= 2
    return t, ACT_WARPS if warps is None else warps


def _grid(m: int, k: int) -> tuple[int, int]:
    return ceil_div(m, GROUP), k // GROUP


@torch.library.custom_op(f"{_NS}::quant_act", mutates_args=())
def _quant_act_op(
    x: torch.Tensor, pow2: bool, write_row: bool, write_t: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = x.shape
    _check_k("quant_act", k)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = _act_outputs(x, m, k, write_row, write_t)
    if m > 0 and (write_row or write_t):
        _require_triton()
        tiles, warps = act_launch(k)
        _act_kernel[(ceil_div(m, GROUP), k // GROUP // tiles)](
            x, *out, m, k, out[2].shape[1], x.stride(0),
            POW2=pow2, WRITE_ROW=write_row, WRITE_T=write_t, BLOCK=GROUP, TILES=tiles, num_warps=warps,
        )
    return out


@_quant_act_op.register_fake
def _(x, pow2, write_row, write_t):
    return _act_outputs(x, *x.shape, write_row, write_t)


def _views(out):
    q, s_store, qt, st_store = out
    return q, s_store.t(), qt, st_store.t()


def quant_act(
    x: torch.Tensor, pow2: bool, write_row: bool = True, write_t: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and transposed blockwise quantization of a 2-D (M, K) CUDA tensor in one pass.

    Returns ``q`` (M, K), ``s`` (M, K/128) column-major, ``qt`` (K, M_pad), ``st`` (K, M_pad/128)
    column-major; outputs not asked for are empty tensors. The op returns the scale storages
    (contiguous); the transposed views are taken here, outside the op.
    """
    return _views(_quant_act_op(x, pow2, write_row, write_t))


def _check_gate_up(name: str, gu: torch.Tensor) -> int:
    m, two_f = gu.shape
    if two_f % (2 * GROUP):
        raise ValueError(f"{name}: the stacked gate-up width ({two_f}) must be a multiple of {2 * GROUP}")
    return two_f // 2


@torch.library.custom_op(f"{_NS}::swiglu_quant", mutates_args=())
def _swiglu_quant_op(
    gu: torch.Tensor, pow2: bool, write_t: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m = gu.shape[0]
    f = _check_gate_up("swiglu_quant", gu)
    if gu.stride(1) != 1:
        gu = gu.contiguous()
    out = _act_outputs(gu, m, f, True, write_t)
    if m > 0:
        _require_triton()
        _swiglu_kernel[_grid(m, f)](
            gu, *out, m, f, out[2].shape[1], gu.stride(0), POW2=pow2, WRITE_T=write_t, BLOCK=GROUP, num_warps=8,
        )
    return out


@_swiglu_quant_op.register_fake
def _(gu, pow2, write_t):
    return _act_outputs(gu, gu.shape[0], gu.shape[1] // 2, True, write_t)


def swiglu_quant(gu: torch.Tensor, pow2: bool, write_t: bool = True):
    """``h = silu(gate) * up`` of the stacked (M, 2F) gate-up output ``gu = [gate | up]``, quantized as
    :func:`quant_act` quantizes ``h`` (M, F); ``h`` itself is never written."""
    return _views(_swiglu_quant_op(gu, pow2, write_t))


@torch.library.custom_op(f"{_NS}::swiglu_bwd_quant", mutates_args=())
def _swiglu_bwd_quant_op(
    gu: torch.Tensor, dh: torch.Tensor, pow2: bool, write_row: bool, write_t: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m = gu.shape[0]
    f = _check_gate_up("swiglu_bwd_quant", gu)
    if dh.shape != (m, f):
        raise ValueError(f"swiglu_bwd_quant: dh has shape {tuple(dh.shape)}, expected {(m, f)}")
    gu = gu if gu.stride(1) == 1 else gu.contiguous()
    dh = dh if dh.stride(1) == 1 else dh.contiguous()
    out = _act_outputs(gu, m, 2 * f, write_row, write_t)
    if m > 0 and (write_row or write_t):
        _require_triton()
        _swiglu_bwd_kernel[_grid(m, f)](
            gu, dh, *out, m, f, out[2].shape[1], gu.stride(0), dh.stride(0),
            POW2=pow2, WRITE_ROW=write_row, WRITE_T=write_t, BLOCK=GROUP, num_warps=_SWIGLU_BWD_WARPS,
        )
    return out


@_swiglu_bwd_quant_op.register_fake
def _(gu, dh, pow2, write_row, write_t):
    return _act_outputs(gu, gu.shape[0], gu.shape[1], write_row, write_t)


# up to five float32 128x128 tiles are live at once (gate, up, dh and the two gradients): twice the
# warps of the other kernels, for twice the registers per tile (the choice measured in benchmarks/fp8_gemm.py)
_SWIGLU_BWD_WARPS = 16


def swiglu_bwd_quant(gu: torch.Tensor, dh: torch.Tensor, pow2: bool, write_row: bool = True, write_t: bool = True):
    """The gradient of ``h = silu(gate) * up`` w.r.t. the stacked ``gu = [gate | up]`` (M, 2F), given
    ``dh`` (M, F), quantized as :func:`quant_act` quantizes it: the output gradient of the stacked
    gate-up linear, whose BF16 form is never written."""
    return _views(_swiglu_bwd_quant_op(gu, dh, pow2, write_row, write_t))


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
