"""Quantization kernels for the CUDA path (Hopper), registered as torch ops (trainer.fp8.ops).

Four ops, all bandwidth-bound, all computing scales as :mod:`trainer.fp8.quantize` does
(``quant_act`` and ``quant_weight`` bit-identical to it; the GPU tests check that). The three
activation ops have two implementations of the same contract, chosen per call by their ``impl``
argument: the Triton kernels below, and the CUDA kernels of ``csrc/quantize.cu`` (in the library
:mod:`trainer.fp8.cutlass_gemm` loads), which hold a tile in registers and read it from DRAM once
instead of twice. ``impl="auto"`` takes CUDA where it can run (a BF16 input, 16-byte aligned, on an
sm_90 GPU with the library loaded; measured faster at every 1.7B shape, benchmarks/RESULTS.md), Triton
otherwise; ``"cuda"`` and ``"triton"`` force one.

- ``quant_act``: one program quantizes one 128x128 tile of a token-major activation or gradient
  (M, K) into (a) the row copy ``q`` (M, K) with one scale per 1x128 group along K (Fprop's A operand,
  or Dgrad's A operand when the input is ``dy``), and (b) the transposed copy ``qt`` (K, M_pad) with one
  scale per 1x128 group along the tokens (Wgrad's operands). The tile comes from DRAM once for both
  copies (the second pass reads it from L2): quantization is memory-bound, and the transposed copy
  otherwise costs a second full read.
- ``swiglu_quant`` / ``swiglu_bwd_quant``: the same, for ``h = silu(gate) * up`` computed from the
  stacked gate-up output, and for ``d[gate | up]`` computed from it and ``dh`` (float32 with a fast
  sigmoid, one rounding: neither ``h`` nor ``d[gate | up]`` is written in BF16).
- ``quant_weight``: one program per 128x128 block of a weight (N, K) writes ``q`` (N, K) and its
  transpose ``qt`` (K, N) with the block's single scale (a square block's scale serves both).

Scales are written straight into the column-major layouts that ``F.scaled_mm`` (and the CUTLASS
kernels) take, so no transposing copy is launched afterwards. ``M_pad`` rounds the token count up to
128: rows past ``M`` are zero in ``qt`` and contribute nothing to Wgrad.

Triton is imported lazily, so this module imports (and the ops register) on CPU-only machines.
"""

from __future__ import annotations

import torch

from trainer.fp8 import cutlass_gemm
from trainer.fp8.ops import op
from trainer.fp8.quantize import FP8_DTYPE, ceil_div
from trainer.fp8.recipe import GROUP

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

    # Each kernel below quantizes one 128 x 128 tile of its output in two passes: the row copy in bands of
    # PART rows (each row's 1x128 group whole), then the transposed copy in bands of PART columns (each
    # column's 128-token group whole), loading (or computing) the band it needs each time; the second
    # pass re-reads the tile from L2. Narrow bands need fewer registers (ptxas -v at 8 warps: 255 a thread
    # for the whole tile in one pass, 64 for bands of 16), but on the H200 more programs per SM did not make
    # the kernels faster (benchmarks/RESULTS.md): LAUNCH holds the measured fastest.

    @triton.jit
    def _store_rows(x, rm, rk, kb, M, K, q_ptr, s_ptr, POW2: tl.constexpr):
        """Row copy of ``x`` (rows ``rm``, the 128 columns ``rk`` of group ``kb`` of a K-wide output):
        ``q`` (M, K) row-major, scales into the (K/128, M) storage of the column-major (M, K/128) operand."""
        in_rows = rm < M
        s_r, inv_r = _scales(tl.max(tl.abs(x), axis=1), POW2)
        q = tl.clamp(x * inv_r[:, None], -448.0, 448.0).to(tl.float8e4nv)
        tl.store(q_ptr + rm[:, None] * K + rk[None, :], q, mask=in_rows[:, None])
        tl.store(s_ptr + kb * M + rm, s_r, mask=in_rows)

    @triton.jit
    def _store_cols(x, rm, rk, mb, K, M_pad, qt_ptr, st_ptr, POW2: tl.constexpr):
        """Transposed copy of ``x`` (the 128 token rows ``rm`` of group ``mb``, columns ``rk``): ``qt``
        (K, M_pad) row-major, scales into the (M_pad/128, K) storage of the (K, M_pad/128) operand.
        Rows past M were loaded as zeros: they are zeros in ``qt`` and add nothing to Wgrad."""
        s_c, inv_c = _scales(tl.max(tl.abs(x), axis=0), POW2)
        # transpose in float32, then cast (keeps 8-bit layouts out of the shared-memory transpose)
        qc = tl.trans(tl.clamp(x * inv_c[None, :], -448.0, 448.0)).to(tl.float8e4nv)
        tl.store(qt_ptr + rk[:, None] * M_pad + rm[None, :], qc)
        tl.store(st_ptr + mb * K + rk, s_c)

    @triton.jit
    def _band(ptr, rm, rk, stride, M):
        return tl.load(ptr + rm[:, None] * stride + rk[None, :], mask=(rm < M)[:, None], other=0.0).to(tl.float32)

    @triton.jit
    def _act_kernel(
        x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, K, M_pad, stride_xm,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
        PART: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        r0, k0 = pid_m * BLOCK, pid_k * BLOCK
        if WRITE_ROW:
            rk = k0 + tl.arange(0, BLOCK)
            for p in tl.range(BLOCK // PART):
                rm = r0 + p * PART + tl.arange(0, PART)
                _store_rows(_band(x_ptr, rm, rk, stride_xm, M), rm, rk, pid_k, M, K, q_ptr, s_ptr, POW2)
        if WRITE_T:
            cm = r0 + tl.arange(0, BLOCK)
            for p in tl.range(BLOCK // PART):
                ck = k0 + p * PART + tl.arange(0, PART)
                _store_cols(_band(x_ptr, cm, ck, stride_xm, M), cm, ck, pid_m, K, M_pad, qt_ptr, st_ptr, POW2)

    @triton.jit
    def _swiglu_band(gu_ptr, rm, rk, stride, M, F):
        """silu(gate) * up in float32 (one rounding, at quantization: as Inductor's fused SwiGLU)."""
        g = _band(gu_ptr, rm, rk, stride, M)
        return g * tl.sigmoid(g) * _band(gu_ptr, rm, rk + F, stride, M)

    @triton.jit
    def _swiglu_kernel(
        gu_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, M_pad, stride_gm,
        POW2: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr, PART: tl.constexpr,
    ):
        """h = silu(gate) * up from the stacked (M, 2F) gate-up output, quantized for the down
        projection: h is never written in BF16."""
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        r0, k0 = pid_m * BLOCK, pid_k * BLOCK
        rk = k0 + tl.arange(0, BLOCK)
        for p in tl.range(BLOCK // PART):
            rm = r0 + p * PART + tl.arange(0, PART)
            _store_rows(_swiglu_band(gu_ptr, rm, rk, stride_gm, M, F), rm, rk, pid_k, M, F, q_ptr, s_ptr, POW2)
        if WRITE_T:
            cm = r0 + tl.arange(0, BLOCK)
            for p in tl.range(BLOCK // PART):
                ck = k0 + p * PART + tl.arange(0, PART)
                _store_cols(_swiglu_band(gu_ptr, cm, ck, stride_gm, M, F), cm, ck, pid_m, F, M_pad,
                            qt_ptr, st_ptr, POW2)

    @triton.jit
    def _swiglu_grad_band(gu_ptr, dh_ptr, rm, rk, stride_g, stride_d, M, F):
        """d(gate), d(up) of h = silu(gate) * up given dh, in float32."""
        g = _band(gu_ptr, rm, rk, stride_g, M)
        u = _band(gu_ptr, rm, rk + F, stride_g, M)
        dh = _band(dh_ptr, rm, rk, stride_d, M)
        sig = tl.sigmoid(g)
        return dh * u * sig * (1.0 + g * (1.0 - sig)), dh * g * sig

    @triton.jit
    def _swiglu_bwd_kernel(
        gu_ptr, dh_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, M, F, M_pad, stride_gm, stride_dm,
        POW2: tl.constexpr, WRITE_ROW: tl.constexpr, WRITE_T: tl.constexpr, BLOCK: tl.constexpr,
        PART: tl.constexpr,
    ):
        """d(gate), d(up) of h = silu(gate) * up, written straight as the quantized output gradient
        (M, 2F) of the stacked gate-up linear: row copy for its Dgrad, transposed copy for its Wgrad."""
        pid_m = tl.program_id(0)
        pid_k = tl.program_id(1)
        r0, k0 = pid_m * BLOCK, pid_k * BLOCK
        up_kb = pid_k + F // BLOCK
        if WRITE_ROW:
            rk = k0 + tl.arange(0, BLOCK)
            for p in tl.range(BLOCK // PART):
                rm = r0 + p * PART + tl.arange(0, PART)
                dg, du = _swiglu_grad_band(gu_ptr, dh_ptr, rm, rk, stride_gm, stride_dm, M, F)
                _store_rows(dg, rm, rk, pid_k, M, 2 * F, q_ptr, s_ptr, POW2)
                _store_rows(du, rm, rk + F, up_kb, M, 2 * F, q_ptr, s_ptr, POW2)
        if WRITE_T:
            cm = r0 + tl.arange(0, BLOCK)
            for p in tl.range(BLOCK // PART):
                ck = k0 + p * PART + tl.arange(0, PART)
                dg, du = _swiglu_grad_band(gu_ptr, dh_ptr, cm, ck, stride_gm, stride_dm, M, F)
                _store_cols(dg, cm, ck, pid_m, 2 * F, M_pad, qt_ptr, st_ptr, POW2)
                _store_cols(du, cm, ck + F, pid_m, 2 * F, M_pad, qt_ptr, st_ptr, POW2)

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


# (rows or columns a band, warps) of the three activation kernels, the fastest of benchmarks/fp8_gemm.py
# --quant-sweep on the H200 (M = 32,768; benchmarks/RESULTS.md)
LAUNCH = {"act": (128, 8), "swiglu": (128, 8), "swiglu_bwd": (32, 8)}


def _grid(m: int, k: int) -> tuple[int, int]:
    return ceil_div(m, GROUP), k // GROUP


IMPLS = ("auto", "cuda", "triton")


def _use_cuda(impl: str, *inputs: torch.Tensor) -> bool:
    """Whether an activation op runs on the CUDA kernels (csrc/quantize.cu) rather than Triton's; with
    ``impl="auto"``, wherever they can."""
    if impl not in IMPLS:
        raise ValueError(f"quantizer impl {impl!r}: expected one of {IMPLS}")
    if impl == "triton":
        return False
    ok = all(cutlass_gemm.quantizers_available(t) and t.data_ptr() % 16 == 0 and t.stride(0) % 8 == 0 for t in inputs)
    if impl == "cuda" and not ok:
        why = cutlass_gemm.available(inputs[0].device)[1] if inputs[0].is_cuda else "not a CUDA tensor"
        raise RuntimeError(f"the CUDA quantizers cannot take {[(t.dtype, t.data_ptr() % 16, t.stride(0)) for t in inputs]} "
                           f"(BF16, 16-byte aligned rows needed; library: {why})")
    return ok


def _wanted(out, write_row: bool, write_t: bool):
    q, s, qt, st = out
    return (q, s) if write_row else (None, None), (qt, st) if write_t else (None, None)


@op("quant_act", mutates_args=())
def _quant_act_op(
    x: torch.Tensor, pow2: bool, write_row: bool, write_t: bool, impl: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m, k = x.shape
    _check_k("quant_act", k)
    if x.stride(1) != 1:
        x = x.contiguous()
    out = _act_outputs(x, m, k, write_row, write_t)
    if m > 0 and (write_row or write_t) and _use_cuda(impl, x):
        (q, s), (qt, st) = _wanted(out, write_row, write_t)
        cutlass_gemm.quant_act_into(x, pow2, q, s, qt, st)
    elif m > 0 and (write_row or write_t):
        _require_triton()
        part, warps = LAUNCH["act"]
        _act_kernel[_grid(m, k)](
            x, *out, m, k, out[2].shape[1], x.stride(0),
            POW2=pow2, WRITE_ROW=write_row, WRITE_T=write_t, BLOCK=GROUP, PART=part, num_warps=warps,
        )
    return out


@_quant_act_op.register_fake
def _(x, pow2, write_row, write_t, impl):
    return _act_outputs(x, *x.shape, write_row, write_t)


def _views(out):
    q, s_store, qt, st_store = out
    return q, s_store.t(), qt, st_store.t()


def quant_act(
    x: torch.Tensor, pow2: bool, write_row: bool = True, write_t: bool = True, impl: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row and transposed blockwise quantization of a 2-D (M, K) CUDA tensor in one pass.

    Returns ``q`` (M, K), ``s`` (M, K/128) column-major, ``qt`` (K, M_pad), ``st`` (K, M_pad/128)
    column-major; outputs not asked for are empty tensors. The op returns the scale storages
    (contiguous); the transposed views are taken here, outside the op.
    """
    return _views(_quant_act_op(x, pow2, write_row, write_t, impl))


def _check_gate_up(name: str, gu: torch.Tensor) -> int:
    m, two_f = gu.shape
    if two_f % (2 * GROUP):
        raise ValueError(f"{name}: the stacked gate-up width ({two_f}) must be a multiple of {2 * GROUP}")
    return two_f // 2


@op("swiglu_quant", mutates_args=())
def _swiglu_quant_op(
    gu: torch.Tensor, pow2: bool, write_t: bool, impl: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m = gu.shape[0]
    f = _check_gate_up("swiglu_quant", gu)
    if gu.stride(1) != 1:
        gu = gu.contiguous()
    out = _act_outputs(gu, m, f, True, write_t)
    if m > 0 and _use_cuda(impl, gu):
        (q, s), (qt, st) = _wanted(out, True, write_t)
        cutlass_gemm.swiglu_quant_into(gu, pow2, q, s, qt, st)
    elif m > 0:
        _require_triton()
        part, warps = LAUNCH["swiglu"]
        _swiglu_kernel[_grid(m, f)](
            gu, *out, m, f, out[2].shape[1], gu.stride(0),
            POW2=pow2, WRITE_T=write_t, BLOCK=GROUP, PART=part, num_warps=warps,
        )
    return out


@_swiglu_quant_op.register_fake
def _(gu, pow2, write_t, impl):
    return _act_outputs(gu, gu.shape[0], gu.shape[1] // 2, True, write_t)


def swiglu_quant(gu: torch.Tensor, pow2: bool, write_t: bool = True, impl: str = "auto"):
    """``h = silu(gate) * up`` of the stacked (M, 2F) gate-up output ``gu = [gate | up]``, quantized as
    :func:`quant_act` quantizes ``h`` (M, F); ``h`` itself is never written."""
    return _views(_swiglu_quant_op(gu, pow2, write_t, impl))


@op("swiglu_bwd_quant", mutates_args=())
def _swiglu_bwd_quant_op(
    gu: torch.Tensor, dh: torch.Tensor, pow2: bool, write_row: bool, write_t: bool, impl: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    m = gu.shape[0]
    f = _check_gate_up("swiglu_bwd_quant", gu)
    if dh.shape != (m, f):
        raise ValueError(f"swiglu_bwd_quant: dh has shape {tuple(dh.shape)}, expected {(m, f)}")
    gu = gu if gu.stride(1) == 1 else gu.contiguous()
    dh = dh if dh.stride(1) == 1 else dh.contiguous()
    out = _act_outputs(gu, m, 2 * f, write_row, write_t)
    if m > 0 and (write_row or write_t) and _use_cuda(impl, gu, dh):
        (q, s), (qt, st) = _wanted(out, write_row, write_t)
        cutlass_gemm.swiglu_bwd_quant_into(gu, dh, pow2, q, s, qt, st)
    elif m > 0 and (write_row or write_t):
        _require_triton()
        part, warps = LAUNCH["swiglu_bwd"]
        _swiglu_bwd_kernel[_grid(m, f)](
            gu, dh, *out, m, f, out[2].shape[1], gu.stride(0), dh.stride(0),
            POW2=pow2, WRITE_ROW=write_row, WRITE_T=write_t, BLOCK=GROUP, PART=part, num_warps=warps,
        )
    return out


@_swiglu_bwd_quant_op.register_fake
def _(gu, dh, pow2, write_row, write_t, impl):
    return _act_outputs(gu, gu.shape[0], gu.shape[1], write_row, write_t)


def swiglu_bwd_quant(gu: torch.Tensor, dh: torch.Tensor, pow2: bool, write_row: bool = True, write_t: bool = True,
                     impl: str = "auto"):
    """The gradient of ``h = silu(gate) * up`` w.r.t. the stacked ``gu = [gate | up]`` (M, 2F), given
    ``dh`` (M, F), quantized as :func:`quant_act` quantizes it: the output gradient of the stacked
    gate-up linear, whose BF16 form is never written."""
    return _views(_swiglu_bwd_quant_op(gu, dh, pow2, write_row, write_t, impl))


@op("quant_weight", mutates_args=())
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
