"""``Fp8Linear``: a drop-in ``nn.Linear`` whose Fprop, Dgrad and Wgrad run in blockwise FP8.

Puro §3.2: the layer "quantizes its BF16 inputs and weights immediately before GEMM and materializes
a BF16 output", and "its quantized input is retained for Wgrad". Here:

- forward: ``x`` (tokens, K) is quantized per 1x128 along K for Fprop and, in the same pass, per
  1x128 along the tokens into the transposed copy Wgrad needs; only that FP8 copy (1 byte per value
  plus one float32 scale per 128) is saved for backward, never the BF16 input. The weight is
  quantized per 128x128 block (its transposed FP8 copy is saved for Dgrad).
- backward: ``dy`` is quantized per 1x128 along N (Dgrad) and along the tokens (Wgrad).
- the output dtype is the autocast dtype under autocast (BF16 in training), else the input's dtype;
  ``dx`` has the input's dtype and ``dw`` the weight's (float32 master weights get float32 gradients).

Parameters are the same ``weight``/``bias`` objects as the ``nn.Linear`` it replaces, so state
dicts, optimizers built before conversion, MuonH radii and HF export are unaffected.

``Fp8Linear.forward_swiglu`` runs a whole SwiGLU MLP with this layer as its down projection
(``_Fp8SwiGLUFn``): gate and up as one linear over their stacked weights, ``silu(gate) * up`` computed
inside the quantization of the down projection's input and its backward inside the quantization of
the gate-up output gradient, so neither exists in BF16.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.fp8 import gemm
from trainer.fp8.quantize import ceil_div, emulate_quantize, quantize_1x128, quantize_128x128
from trainer.fp8.recipe import GROUP, Fp8Recipe
from trainer.fp8.triton_kernels import (
    quant_act,
    quant_weight,
    swiglu_bwd_quant,
    swiglu_quant,
    triton_available,
)

EMULATE = "emulate"
FUSED = ("auto", "cuda", "triton")
"""Resolved quantizers that run the fused kernels of :mod:`trainer.fp8.triton_kernels` (the value is the
ops' ``impl``: CUDA where it can run, or one forced); the other one is ``torch`` (plain ops)."""
SCALED_MM = "cuda-scaled-mm"
_NO_STEP = (None, None, None)   # no step copy of a weight: quantize it where it is used


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def _resolve(backend_pref: str, quantizer_pref: str, x: torch.Tensor, weight: torch.Tensor) -> tuple[str, str]:
    """(backend, quantizer) for this call, from plain strings, so that ``torch.compile`` resolves it
    at trace time without touching the (pydantic) recipe object."""
    n, k = weight.shape
    aligned = k % GROUP == 0 and n % GROUP == 0
    if backend_pref == EMULATE or not x.is_cuda:
        if backend_pref == SCALED_MM:
            raise RuntimeError("fp8 backend 'cuda-scaled-mm' needs CUDA tensors; use 'auto' or 'emulate'")
        return EMULATE, "torch"
    if backend_pref == SCALED_MM and not aligned:
        raise RuntimeError(
            f"fp8 backend 'cuda-scaled-mm' needs in/out features divisible by {GROUP}, got ({k}, {n}); "
            "use backend 'auto' (falls back to the emulation for such layers) or exclude the layer"
        )
    caps = gemm._CAPS.get(("cuda", x.device.index if x.device.index is not None else 0))
    if caps is None and not _compiling():
        caps = gemm.probe_scaled_mm(x.device)
    if caps is None or not caps.blockwise or not aligned:
        if backend_pref == SCALED_MM:
            reason = caps.reason if caps is not None else "not probed before torch.compile traced the layer"
            raise RuntimeError(f"fp8 backend 'cuda-scaled-mm' is not usable here: {reason}")
        if caps is not None and not caps.blockwise and not _compiling():
            _warn_once(f"fp8: F.scaled_mm blockwise unusable on {x.device} ({caps.reason}); "
                       "falling back to the (slow) emulation")
        return EMULATE, "torch"
    quantizer = quantizer_pref
    if quantizer == "auto":
        # Triton whenever it is there, compiled or not: the torch-op quantizer traced by Inductor is
        # correct but took > 230 s to compile for the 1.7B preset on the H200 (Triton custom ops: one
        # graph, no breaks, compile time as BF16); see benchmarks/RESULTS.md
        quantizer = "auto" if triton_available() else "torch"
    return SCALED_MM, quantizer


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _caps_for(x: torch.Tensor) -> gemm.ScaledMmCaps:
    return gemm._CAPS[("cuda", x.device.index if x.device.index is not None else 0)]


def _pad_rows(x2: torch.Tensor) -> torch.Tensor:
    m = x2.shape[0]
    m_pad = ceil_div(m, GROUP) * GROUP
    return x2 if m_pad == m else F.pad(x2, (0, 0, 0, m_pad - m))


def _quantize(t: torch.Tensor, scale_format: str, backend: str, block_rows: int):
    """The reference quantization (1x128 groups, or 128x128 blocks with ``block_rows`` 128) in torch ops on cuBLAS's
    path, where Inductor fuses them into their producers; the emulation's opaque op otherwise."""
    if backend == SCALED_MM:
        return (quantize_1x128 if block_rows == 1 else quantize_128x128)(t, scale_format)
    return emulate_quantize(t, scale_format, block_rows)


def _quant_act(x2: torch.Tensor, scale_format: str, quantizer: str, backend: str, rows: bool, transposed: bool):
    """(q, s, qt, st): row copy with groups along the columns, and the transposed copy with groups
    along the rows (tokens). Missing copies are None."""
    if quantizer in FUSED:
        q, s, qt, st = quant_act(x2, scale_format == "pow2", rows, transposed, impl=quantizer)
        return (q, s) if rows else (None, None), (qt, st) if transposed else (None, None)
    row = _quantize(x2, scale_format, backend, 1) if rows else (None, None)
    if transposed:
        # cuBLAS needs the token (reduction) dimension of Wgrad padded to 128; zero rows add nothing
        src = _pad_rows(x2) if backend == SCALED_MM else x2
        col = _quantize(src.t(), scale_format, backend, 1)
    else:
        col = (None, None)
    return row, col


def _quant_weight(weight: torch.Tensor, scale_format: str, quantizer: str, backend: str, transposed: bool,
                  step: tuple = _NO_STEP):
    """(wq, ws, wtq): the 128x128-quantized weight, its (N/128, K/128) scales and, for the cuBLAS
    Dgrad, the transposed row-major FP8 copy (None otherwise). ``step``: the step's copy of them
    (:meth:`Fp8Linear.set_step_weight`), used instead of quantizing again when given."""
    if step[0] is not None:
        wq, ws, wtq = step
        return wq, ws, (wtq if transposed and backend == SCALED_MM else None)
    if quantizer in FUSED:  # weights (float32 masters): the Triton kernel
        wq, wtq, ws = quant_weight(weight, scale_format == "pow2", transposed and backend == SCALED_MM)
        return wq, ws, (wtq if transposed and backend == SCALED_MM else None)
    wq, ws = _quantize(weight, scale_format, backend, GROUP)
    wtq = wq.t().contiguous() if (transposed and backend == SCALED_MM) else None
    return wq, ws, wtq


def _fprop(xq, xs, wq, ws, backend, x, out_dtype, lib):
    if backend == SCALED_MM:
        y = gemm.scaled_mm_fprop(xq, xs, wq, ws, _caps_for(x), out_dtype=torch.bfloat16, lib=lib)
    else:
        y = gemm.emulate_gemm("fprop", xq, xs, wq, ws)
    return y.to(out_dtype)


def _output_dtype(x: torch.Tensor) -> torch.dtype:
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, step_q, step_s, step_qt, grad_into, scale_format: str, backend: str,
                quantizer: str, lib: str, out_dtype: torch.dtype):
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        (xq, xs), (xtq, xts) = _quant_act(x2, scale_format, quantizer, backend, rows=True, transposed=need_dw)
        wq, ws, wtq = _quant_weight(weight, scale_format, quantizer, backend, transposed=need_dx,
                                    step=(step_q, step_s, step_qt))
        y = _fprop(xq, xs, wq, ws, backend, x, out_dtype, lib)
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.scale_format, ctx.backend, ctx.quantizer, ctx.lib = scale_format, backend, quantizer, lib
        ctx.m, ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x2.shape[0], x.shape, x.dtype, weight.dtype
        ctx.has_bias = bias is not None
        # what backward needs: FP8 x^T (Wgrad) and FP8 w (Dgrad: the transposed copy on cuBLAS)
        w_for_dgrad = wtq if backend == SCALED_MM else wq
        ctx.save_for_backward(
            xtq if need_dw else None, xts if need_dw else None,
            w_for_dgrad if need_dx else None, ws if need_dx else None,
            grad_into if need_dw else None,
        )
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xtq, xts, wdq, ws, grad_into = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n = dy.shape[-1]
        dy2 = dy.reshape(-1, n)
        backend = ctx.backend
        (dyq, dys), (dytq, dyts) = _quant_act(
            dy2, ctx.scale_format, ctx.quantizer, backend, rows=need_dx, transposed=need_dw
        )
        dx = dw = db = None
        if need_dx:
            dx = _dgrad(dyq, dys, wdq, ws, backend, dy, ctx.lib).to(ctx.x_dtype).reshape(ctx.x_shape)
        if need_dw:
            dw = _wgrad(dytq, dyts, xtq, xts, backend, dy, ctx.w_dtype, ctx.lib, into=grad_into)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db, *([None] * 9)


def _dgrad(dyq, dys, wdq, ws, backend, like, lib):
    if backend == SCALED_MM:
        return gemm.scaled_mm_dgrad(dyq, dys, wdq, ws, _caps_for(like), out_dtype=torch.bfloat16, lib=lib)
    return gemm.emulate_gemm("dgrad", dyq, dys, wdq, ws)


def _wgrad(dytq, dyts, xtq, xts, backend, like, w_dtype, lib, into=None):
    """The weight gradient, or None where it is added into ``into`` (the step's float32 gradient buffer,
    `step_weights(grads=True)`): in the GEMM's epilogue, with no product written and read back."""
    if into is not None:
        if backend == SCALED_MM:
            gemm.scaled_mm_wgrad_into(dytq, dyts, xtq, xts, into, _caps_for(like), lib=lib)
        else:
            gemm.emulate_wgrad_into(dytq, dyts, xtq, xts, into)
        return None
    if backend == SCALED_MM:
        return gemm.scaled_mm_wgrad(dytq, dyts, xtq, xts, _caps_for(like), out_dtype=w_dtype, lib=lib)
    return gemm.emulate_gemm("wgrad", dytq, dyts, xtq, xts).to(w_dtype)


def _swiglu_quant(gu, scale_format, quantizer, backend, transposed):
    """The down projection's quantized input ``h = silu(gate) * up`` from the stacked gate-up output
    ``gu`` (M, 2F), computed in float32 and rounded once, by the quantization (as Inductor's fused
    SwiGLU): one Triton pass that never writes ``h``, or torch ops then :func:`_quant_act`."""
    if quantizer in FUSED:
        q, s, qt, st = swiglu_quant(gu, scale_format == "pow2", transposed, impl=quantizer)
        return (q, s), (qt, st) if transposed else (None, None)
    gate, up = gu.float().chunk(2, dim=-1)
    return _quant_act(F.silu(gate) * up, scale_format, quantizer, backend, rows=True, transposed=transposed)


def _swiglu_bwd_quant(gu, dh, scale_format, quantizer, backend, rows, transposed):
    """The quantized output gradient of the stacked gate-up linear, ``d[gate | up]`` of
    ``h = silu(gate) * up`` given ``dh``, in float32 (autograd's formulas), rounded once by the quantization."""
    if quantizer in FUSED:
        q, s, qt, st = swiglu_bwd_quant(gu, dh, scale_format == "pow2", rows, transposed, impl=quantizer)
        return (q, s) if rows else (None, None), (qt, st) if transposed else (None, None)
    gate, up = gu.float().chunk(2, dim=-1)
    dh = dh.float()
    dgu = torch.cat([torch.ops.aten.silu_backward(dh * up, gate), dh * F.silu(gate)], dim=-1)
    return _quant_act(dgu, scale_format, quantizer, backend, rows=rows, transposed=transposed)


def _swiglu_forward(x2, w_gu, w_down, fmt, backend, quantizer, lib, out_dtype, need_dx, need_dwgu, need_dwd,
                    step_gu=_NO_STEP, step_down=_NO_STEP):
    """``y = down(silu(gate) * up)`` of the (M, D) input ``x2``, and what backward needs (Nones where a
    gradient is not wanted; all None for inference). ``step_*``: the step's quantized weights, if any."""
    need_dh = need_dx or need_dwgu
    (xq, xs), (xtq, xts) = _quant_act(x2, fmt, quantizer, backend, rows=True, transposed=need_dwgu)
    wq, ws, wtq = _quant_weight(w_gu, fmt, quantizer, backend, transposed=need_dx, step=step_gu)
    gu = _fprop(xq, xs, wq, ws, backend, x2, out_dtype, lib)
    (hq, hs), (htq, hts) = _swiglu_quant(gu, fmt, quantizer, backend, transposed=need_dwd)
    w2q, w2s, w2tq = _quant_weight(w_down, fmt, quantizer, backend, transposed=need_dh, step=step_down)
    y = _fprop(hq, hs, w2q, w2s, backend, x2, out_dtype, lib)
    transposed_w = backend == SCALED_MM   # the CUDA Dgrad reads the row-major transposed FP8 weight
    saved = (
        gu if need_dh else None,
        xtq if need_dwgu else None, xts if need_dwgu else None,
        (wtq if transposed_w else wq) if need_dx else None, ws if need_dx else None,
        htq if need_dwd else None, hts if need_dwd else None,
        (w2tq if transposed_w else w2q) if need_dh else None, w2s if need_dh else None,
    )
    return y, saved


class _Fp8SwiGLUFn(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` with the three linears in blockwise FP8, gate and up as one
    linear over their stacked weight ``w_gu`` (2F, D). The SwiGLU product is fused into the
    quantization of the down projection's input, and its backward into the quantization of the
    gate-up output gradient: neither ``h`` nor ``d[gate | up]`` exists in BF16. Saved for backward:
    FP8 ``x^T`` and ``h^T`` (Wgrads), the FP8 weights (Dgrads) and the BF16 gate-up output."""

    @staticmethod
    def forward(ctx, x, w_gu, w_down, gu_q, gu_s, gu_qt, gu_grad, down_q, down_s, down_qt, down_grad,
                scale_format: str, backend: str, quantizer: str, lib: str, out_dtype: torch.dtype):
        x2 = x.reshape(-1, x.shape[-1])
        y, saved = _swiglu_forward(x2, w_gu, w_down, scale_format, backend, quantizer, lib, out_dtype,
                                   *ctx.needs_input_grad[:3], step_gu=(gu_q, gu_s, gu_qt),
                                   step_down=(down_q, down_s, down_qt))
        ctx.scale_format, ctx.backend, ctx.quantizer, ctx.lib = scale_format, backend, quantizer, lib
        ctx.x_shape, ctx.x_dtype, ctx.w_dtypes = x.shape, x.dtype, (w_gu.dtype, w_down.dtype)
        ctx.save_for_backward(*saved, gu_grad if ctx.needs_input_grad[1] else None,
                              down_grad if ctx.needs_input_grad[2] else None)
        return y.reshape(*x.shape[:-1], w_down.shape[0])

    @staticmethod
    def backward(ctx, dy):
        gu, xtq, xts, wdq, ws, htq, hts, w2dq, w2s, gu_grad, down_grad = ctx.saved_tensors
        need_dx, need_dwgu, need_dwd = ctx.needs_input_grad[:3]
        need_dh = need_dx or need_dwgu
        fmt, quantizer, backend = ctx.scale_format, ctx.quantizer, ctx.backend
        dy2 = dy.reshape(-1, dy.shape[-1])
        (dyq, dys), (dytq, dyts) = _quant_act(dy2, fmt, quantizer, backend, rows=need_dh, transposed=need_dwd)
        dx = dw_gu = dw_down = None
        if need_dwd:
            dw_down = _wgrad(dytq, dyts, htq, hts, backend, dy, ctx.w_dtypes[1], ctx.lib, into=down_grad)
        if need_dh:
            dh = _dgrad(dyq, dys, w2dq, w2s, backend, dy, ctx.lib).to(gu.dtype)
            (gq, gs), (gtq, gts) = _swiglu_bwd_quant(gu, dh, fmt, quantizer, backend, rows=need_dx,
                                                     transposed=need_dwgu)
            if need_dx:
                dx = _dgrad(gq, gs, wdq, ws, backend, dy, ctx.lib).to(ctx.x_dtype).reshape(ctx.x_shape)
            if need_dwgu:
                dw_gu = _wgrad(gtq, gts, xtq, xts, backend, dy, ctx.w_dtypes[0], ctx.lib, into=gu_grad)
        return dx, dw_gu, dw_down, *([None] * 13)


def _fp8_swiglu(x, w_gu, w_down, scale_format: str, backend_pref: str, quantizer_pref: str,
                lib: str, step_gu: tuple = _NO_STEP, step_down: tuple = _NO_STEP,
                grads: tuple = (None, None)) -> torch.Tensor | None:
    """The fused SwiGLU MLP, or None where its linears would not run on one backend and quantizer
    (then the caller runs them one by one)."""
    backend, quantizer = _resolve(backend_pref, quantizer_pref, x, w_gu)
    if _resolve(backend_pref, quantizer_pref, x, w_down) != (backend, quantizer):
        return None
    out_dtype = _output_dtype(x)
    if not (torch.is_grad_enabled() and (x.requires_grad or w_gu.requires_grad or w_down.requires_grad)):
        y, _ = _swiglu_forward(x.reshape(-1, x.shape[-1]), w_gu, w_down, scale_format, backend, quantizer, lib,
                               out_dtype, False, False, False, step_gu, step_down)
        return y.reshape(*x.shape[:-1], w_down.shape[0])
    return _Fp8SwiGLUFn.apply(x, w_gu, w_down, *step_gu, grads[0], *step_down, grads[1], scale_format, backend,
                              quantizer, lib, out_dtype)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    recipe: Fp8Recipe | None = None,
) -> torch.Tensor:
    """``F.linear`` with Fprop, Dgrad and Wgrad in blockwise FP8 (Puro §3.2)."""
    r = recipe if recipe is not None else Fp8Recipe()
    return _fp8_linear(x, weight, bias, r.scale_format, r.backend, r.quantizer, r.gemm)


def _fp8_linear(x, weight, bias, scale_format: str, backend_pref: str, quantizer_pref: str, lib: str,
                step: tuple = _NO_STEP, grad_into: torch.Tensor | None = None) -> torch.Tensor:
    backend, quantizer = _resolve(backend_pref, quantizer_pref, x, weight)
    out_dtype = _output_dtype(x)
    if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        # inference: no transposed copies, nothing saved
        x2 = x.reshape(-1, x.shape[-1])
        (xq, xs), _ = _quant_act(x2, scale_format, quantizer, backend, rows=True, transposed=False)
        wq, ws, _ = _quant_weight(weight, scale_format, quantizer, backend, transposed=False, step=step)
        y = _fprop(xq, xs, wq, ws, backend, x, out_dtype, lib)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return _Fp8LinearFn.apply(x, weight, bias, *step, grad_into, scale_format, backend, quantizer, lib, out_dtype)


class Fp8Linear(nn.Linear):
    """``nn.Linear`` computed in blockwise FP8; same parameters, same state-dict keys."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: Fp8Recipe | None = None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._register_step_buffers()
        self.set_recipe(recipe)

    def _register_step_buffers(self) -> None:
        # the step's FP8 copy of the weight this layer computes with (`set_step_weight`), and the float32 buffer
        # its weight gradient is added into (`step_weights(grads=True)`); None outside a step. Buffers, so that
        # a compiled block takes them as inputs (one graph for every block), never saved
        for name in ("step_q", "step_s", "step_qt", "step_grad"):
            self.register_buffer(name, None, persistent=False)

    def set_recipe(self, recipe: Fp8Recipe | None) -> None:
        self.recipe = recipe if recipe is not None else Fp8Recipe()
        # plain strings for the traced forward
        self.scale_format = self.recipe.scale_format
        self.backend_pref = self.recipe.backend
        self.quantizer_pref = self.recipe.quantizer
        self.gemm_pref = self.recipe.gemm

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: Fp8Recipe | None = None) -> Fp8Linear:
        """A new ``Fp8Linear`` that shares ``linear``'s parameter objects (no copy)."""
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight = linear.weight
        new.bias = linear.bias
        new._register_step_buffers()
        new.set_recipe(recipe)
        new.train(linear.training)
        return new

    @torch.no_grad()
    def set_step_weight(self, weight: torch.Tensor | None = None) -> None:
        """Quantize the weight this layer computes with (its own, or the stack of its siblings' weights that
        `trainer.fp8.modules.stacked_linears` passes) once, for every micro-batch of an optimizer step: the weights do
        not change between them. `clear_step_weight` ends it; the optimizer must not step in between."""
        w = self.weight if weight is None else weight
        backend, quantizer = _resolve(self.backend_pref, self.quantizer_pref, w, w)
        self.step_q, self.step_s, self.step_qt = _quant_weight(w.detach(), self.scale_format, quantizer, backend,
                                                               transposed=True)

    def clear_step_weight(self) -> None:
        self.step_q = self.step_s = self.step_qt = self.step_grad = None

    def step_weight(self, weight: torch.Tensor) -> tuple:
        """The step's copy (q, s, qt) when it is the quantization of a weight shaped like ``weight``, else Nones."""
        if self.step_q is None or self.step_q.shape != weight.shape:
            return _NO_STEP
        return self.step_q, self.step_s, self.step_qt

    def step_grad_into(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The step's gradient buffer when it holds the gradient of a weight shaped like ``weight``, else None."""
        g = self.step_grad
        return g if g is not None and g.shape == weight.shape and weight.requires_grad else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_weight(x, self.weight, self.bias)

    def forward_weight(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """This layer's recipe applied to another weight: `trainer.fp8.modules.stacked_linears` passes the
        stacked weights of q, k, v (or gate, up) so that their shared input is quantized once."""
        return _fp8_linear(x, weight, bias, self.scale_format, self.backend_pref, self.quantizer_pref, self.gemm_pref,
                           self.step_weight(weight), self.step_grad_into(weight))

    def forward_swiglu(self, x: torch.Tensor, w_gate_up: torch.Tensor,
                       gate_up_owner: "Fp8Linear | None" = None) -> torch.Tensor | None:
        """This layer as the down projection of a SwiGLU MLP, ``self(silu(gate) * up)`` with
        ``[gate | up] = x w_gate_up^T``, in one fused FP8 computation (`trainer.fp8.modules.Fp8MLP` passes the
        stacked gate and up weights, and the gate projection, which holds the stack's step copy). None where
        the fusion does not apply (a bias, or linears that resolve to different backends): the caller then
        runs the linears one by one."""
        if self.bias is not None:
            return None
        step_gu = gate_up_owner.step_weight(w_gate_up) if gate_up_owner is not None else _NO_STEP
        grad_gu = gate_up_owner.step_grad_into(w_gate_up) if gate_up_owner is not None else None
        return _fp8_swiglu(x, w_gate_up, self.weight, self.scale_format, self.backend_pref, self.quantizer_pref,
                           self.gemm_pref, step_gu, self.step_weight(self.weight),
                           (grad_gu, self.step_grad_into(self.weight)))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8=blockwise-e4m3, scales={self.scale_format}, backend={self.backend_pref}, gemm={self.gemm_pref}"


@contextlib.contextmanager
def step_weights(stacks: Iterable[tuple[nn.Module, ...]],
                 stack: Callable[[tuple[nn.Module, ...]], torch.Tensor], grads: bool = False) -> Iterator[int]:
    """Quantize each FP8 weight stack once for an optimizer step's micro-batches, instead of once a
    micro-batch: a stack (``trainer.fp8.modules.weight_stacks``) of ``Fp8Linear`` siblings is stacked by ``stack``
    (``trainer.fp8.modules.stacked_weight``, what the forward stacks) and quantized into its first linear's step copy
    (`Fp8Linear.set_step_weight`), which every forward of the step then reads. Yields the number of copies made;
    the copies are dropped on exit (before the optimizer steps), even when the step raises.

    ``grads``: the Wgrad GEMMs of the step add into one float32 buffer a stack, zeroed on entry (the GEMM's
    epilogue adds, so no micro-batch's gradient is written and then added: Megatron's gradient-accumulation
    fusion), instead of returning each micro-batch's gradient to autograd. When the step ends without an error,
    each weight's ``.grad`` is its rows of the buffer (a view; added to a ``.grad`` something else left). The same
    float32 sums in the same order as autograd's accumulation, bit for bit. The buffers are allocated once and
    kept (as ``.grad`` would be); only for one process (DDP and FSDP hook the weights' own accumulation)."""
    owners = []
    try:
        for linears in stacks:
            owner = linears[0]
            if not isinstance(owner, Fp8Linear) or any(type(m) is not type(owner) for m in linears):
                continue
            w = stack(linears)
            owner.set_step_weight(w)
            if grads and w.requires_grad:
                buffer = getattr(owner, "_grad_buffer", None)
                if buffer is None or buffer.shape != w.shape or buffer.device != w.device:
                    buffer = owner._grad_buffer = torch.empty(w.shape, dtype=torch.float32, device=w.device)
                owner.step_grad = buffer
            owners.append((owner, linears))
        buffers = [o.step_grad for o, _ in owners if o.step_grad is not None]
        if buffers:
            torch._foreach_zero_(buffers)
        yield len(owners)
        for owner, linears in owners:
            if owner.step_grad is not None:
                _assign_grads(linears, owner.step_grad)
    finally:
        for owner, _ in owners:
            owner.clear_step_weight()


@torch.no_grad()
def _assign_grads(linears: tuple[nn.Module, ...], buffer: torch.Tensor) -> None:
    """Each linear's rows of a stack's gradient buffer as its weight's ``.grad`` (none for a frozen weight). A
    ``.grad`` that already is those rows (the last step's, zeroed in place by ``zero_grad(set_to_none=False)``
    and by the entry of this step) holds this step's gradient already: it is not added to itself."""
    for m, g in zip(linears, buffer.split([m.weight.shape[0] for m in linears])):
        if not m.weight.requires_grad:
            continue
        if m.weight.grad is None or m.weight.grad.data_ptr() == g.data_ptr():
            m.weight.grad = g
        else:
            m.weight.grad.add_(g)
