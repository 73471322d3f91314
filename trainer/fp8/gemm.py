"""The three GEMMs of a blockwise-FP8 linear layer: emulated, on cuBLAS through ``F.scaled_mm``, or on
CUTLASS's Hopper kernels (:mod:`trainer.fp8.cutlass_gemm`), chosen per shape from a measured table.

Notation (Puro §3.2): ``x`` (M, K) tokens x in-features, ``w`` (N, K), ``y = x w^T`` (M, N).

==========  =====================  ===========================  ==========================
GEMM        A (groups along red.)  B                            reduction
==========  =====================  ===========================  ==========================
Fprop       x, 1x128 along K       w, 128x128                   K
Dgrad       dy, 1x128 along N      w, 128x128 (used as w^T^T)   N
Wgrad       dy^T, 1x128 along M    x^T, 1x128 along M           M (tokens)
==========  =====================  ===========================  ==========================

The emulation dequantizes (exact: E4M3 values times power-of-two scales fit float32) and multiplies
in float32, so it differs from the tensor-core result only by float32 summation order. It runs on any
device and is what CI tests; on the GPU the cuBLAS path is checked against it.

``F.scaled_mm`` layouts (measured on the lent H200, ``shared/spec/environment.md`` §10): both operands
K-major (B passed as the transpose of a row-major (N, K) tensor), 1x128 scales as an (rows, K/128)
column-major tensor, 128x128 scales as a (Kb, Nb) column-major tensor, where some PyTorch versions
want Kb rounded up to a multiple of 4. Which form this PyTorch wants, and whether Wgrad can write
float32 directly, is found once per device by :func:`probe_scaled_mm` on small random problems
checked against the emulation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from trainer.fp8 import cutlass_gemm
from trainer.fp8.ops import op
from trainer.fp8.quantize import (
    colmajor,
    dequantize_1x128,
    dequantize_128x128,
    quantize_1x128,
    quantize_128x128,
)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Emulation (any device)
# ----------------------------------------------------------------------------------------------


def _no_autocast(device_type: str):
    return torch.autocast(device_type=device_type, enabled=False)


def emulated_fprop(xq, xs, wq, ws, compute_dtype=torch.float32) -> torch.Tensor:
    """``y = deq(x) deq(w)^T`` in ``compute_dtype`` (float32 by default)."""
    with _no_autocast(xq.device.type):
        a = dequantize_1x128(xq, xs).to(compute_dtype)
        b = dequantize_128x128(wq, ws).to(compute_dtype)
        return a @ b.t()


def emulated_dgrad(dyq, dys, wq, ws, compute_dtype=torch.float32) -> torch.Tensor:
    """``dx = deq(dy) deq(w)``."""
    with _no_autocast(dyq.device.type):
        a = dequantize_1x128(dyq, dys).to(compute_dtype)
        b = dequantize_128x128(wq, ws).to(compute_dtype)
        return a @ b


def emulated_wgrad(dytq, dyts, xtq, xts, compute_dtype=torch.float32) -> torch.Tensor:
    """``dw = deq(dy^T) deq(x^T)^T``, both quantized along the tokens."""
    with _no_autocast(dytq.device.type):
        a = dequantize_1x128(dytq, dyts).to(compute_dtype)
        b = dequantize_1x128(xtq, xts).to(compute_dtype)
        return a @ b.t()


# The emulated GEMMs as ops Inductor does not look into, as the emulated quantizations
# (`quantize.emulate_quantize`, whose comment says why): what the ``emulate`` backend calls.


_EMULATED = {"fprop": emulated_fprop, "dgrad": emulated_dgrad, "wgrad": emulated_wgrad}


@op("emulate_gemm", mutates_args=())
def emulate_gemm(role: str, a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """The emulated Fprop, Dgrad or Wgrad (``role``, :func:`emulated_fprop` and its siblings) as one opaque op,
    float32 out."""
    return _EMULATED[role](a, sa, b, sb)


@emulate_gemm.register_fake
def _(role, a, sa, b, sb):
    return a.new_empty((a.shape[0], b.shape[1] if role == "dgrad" else b.shape[0]), dtype=torch.float32)


@op("emulate_wgrad_into", mutates_args=("out",))
def emulate_wgrad_into(dytq: torch.Tensor, dyts: torch.Tensor, xtq: torch.Tensor, xts: torch.Tensor,
                       out: torch.Tensor) -> None:
    """``out += emulated_wgrad(...)`` in place: the emulation's form of the GEMM that accumulates
    (`scaled_mm_wgrad_into`)."""
    out.add_(emulated_wgrad(dytq, dyts, xtq, xts))


@emulate_wgrad_into.register_fake
def _(dytq, dyts, xtq, xts, out):
    return None


# ----------------------------------------------------------------------------------------------
# cuBLAS blockwise through F.scaled_mm (CUDA, Hopper and later)
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScaledMmCaps:
    """What ``F.scaled_mm`` blockwise does on one device (found by :func:`probe_scaled_mm`)."""

    blockwise: bool
    reason: str = ""
    pad_block_scales: bool = True  # 128x128 scale operand: reduction blocks rounded up to 4
    wgrad_fp32_out: bool = False


_CAPS: dict[tuple[str, int], ScaledMmCaps] = {}


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def block_scale_operand(s: torch.Tensor, pad: bool) -> torch.Tensor:
    """128x128 scales of B given as (out_blocks, red_blocks) -> the (red_blocks[, padded], out_blocks)
    column-major operand of ``F.scaled_mm``."""
    out_blocks, red_blocks = s.shape
    width = _round_up(red_blocks, 4) if pad else red_blocks
    if width != red_blocks:
        s = F.pad(s, (0, width - red_blocks), value=1.0)
    return s.contiguous().t()


_BW1x128 = getattr(getattr(F, "ScalingType", None), "BlockWise1x128", None)
_BW128x128 = getattr(getattr(F, "ScalingType", None), "BlockWise128x128", None)


# ----------------------------------------------------------------------------------------------
# Which library runs a GEMM: cuBLAS or one of CUTLASS's Hopper kernels, per shape, from a measured table
# ----------------------------------------------------------------------------------------------

GEMM_TABLE = Path(__file__).with_name("gemm_table.json")
"""Per device name, GEMM role (fprop / dgrad / wgrad) and kernel shape "MxNxK" (Wgrad: out-features x
in-features x tokens): the library, and CUTLASS config, measured fastest by ``benchmarks/fp8_cutlass.py
--write-table`` (its command, date and rule are in the file)."""


@dataclasses.dataclass(frozen=True)
class GemmChoice:
    library: str                 # "cublas" or "cutlass"
    config: str = ""             # the CUTLASS kernel config (trainer.fp8.cutlass_gemm.configs)
    raster: str = "heuristic"
    swizzle: int = 1


CUBLAS = GemmChoice("cublas")
ROLE_KIND = {"fprop": "act_weight", "dgrad": "act_weight", "wgrad": "act_act"}
"""The CUTLASS kernel kind (``cutlass_gemm.KINDS``) that serves each GEMM role."""


@functools.lru_cache(maxsize=None)
def _table(path: Path = GEMM_TABLE) -> dict:
    return json.loads(path.read_text()).get("devices", {}) if path.exists() else {}


_TOKEN_DIM = {"fprop": 0, "dgrad": 0, "wgrad": 2}   # which of M, N, K counts the tokens


def table_entry(device_name: str, role: str, m: int, n: int, k: int, table: dict | None = None) -> GemmChoice | None:
    """The measured choice for this role and shape on ``device_name``: the exact shape, else the exact
    shape measured for the other role of the same kind (Fprop and Dgrad are the same GEMM: the gate
    projection's Fprop is the down projection's Dgrad), else the same weight shape measured at the
    nearest token count (M of Fprop/Dgrad, K of Wgrad), else None."""
    device_rows = (table if table is not None else _table()).get(device_name, {})
    rows = device_rows.get(role, {})
    same_kind = [role] + [r for r in ROLE_KIND if r != role and ROLE_KIND[r] == ROLE_KIND[role]]
    hit = next((device_rows[r][f"{m}x{n}x{k}"] for r in same_kind if f"{m}x{n}x{k}" in device_rows.get(r, {})), None)
    if hit is None:
        t = _TOKEN_DIM[role]
        want = (m, n, k)
        near = []
        for key, v in rows.items():
            dims = tuple(int(d) for d in key.split("x"))
            if all(dims[i] == want[i] for i in range(3) if i != t):
                near.append((abs(math.log2(dims[t] / want[t])), v))
        hit = min(near, key=lambda pair: pair[0])[1] if near else None
    return None if hit is None else GemmChoice(**hit)


_CHOICES: dict[tuple, GemmChoice] = {}


def pick_gemm(role: str, m: int, n: int, k: int, lib: str, usable: tuple[bool, str], device_name: str,
              built: list[str], table: dict | None = None) -> tuple[GemmChoice, str]:
    """The library (and config) of one blockwise GEMM, and why (pure: what the library and the device are is
    given). ``usable``: whether the CUTLASS library runs here, and why not; ``built``: the library's configs of
    this role's kind that run (N, K); ``table``: the measured table (default ``gemm_table.json``)."""
    if lib == "cublas":
        return CUBLAS, "the recipe's gemm is cublas"
    ok, why_not = usable
    if not ok:
        if lib == "cutlass":
            raise RuntimeError(f"fp8 gemm 'cutlass' is not usable here: {why_not}")
        return CUBLAS, why_not
    entry = table_entry(device_name, role, m, n, k, table)
    if entry is None:
        reason = f"gemm_table.json has no {device_name} row for this shape"
    elif entry.library != "cutlass":
        reason = f"measured faster than the library on {device_name} (gemm_table.json)"
    elif entry.config not in built:
        # the table names a config this build lacks (a DeepGEMM one, built without $DEEPGEMM_DIR)
        extra = ": build with DEEPGEMM_DIR set" if entry.config.startswith("deepgemm_") else ""
        reason = f"gemm_table.json's config {entry.config} is not in this library build{extra}"
        entry = None
    else:
        return entry, f"measured fastest on {device_name} (gemm_table.json)"
    if lib == "cutlass" and built:
        return GemmChoice("cutlass", built[0]), f"the recipe's gemm is cutlass ({reason})"
    return CUBLAS, reason


def decide_gemm(role: str, m: int, n: int, k: int, lib: str, device: torch.device) -> tuple[GemmChoice, str]:
    """:func:`pick_gemm` for ``device``: whether the library loads and runs there, its name, the built configs."""
    usable = cutlass_gemm.available(device) if lib != "cublas" else (False, "")
    name = torch.cuda.get_device_name(device) if usable[0] else ""
    built = cutlass_gemm.configs(ROLE_KIND[role], n, k) if usable[0] else []
    return pick_gemm(role, m, n, k, lib, usable, name, built)


def choose_gemm(role: str, m: int, n: int, k: int, lib: str, device: torch.device) -> GemmChoice:
    """The library (and CUTLASS config) of one blockwise GEMM. ``lib``: the recipe's ``gemm``; with
    ``auto``, the measured table's choice for this device and shape, cuBLAS where it has none or the
    CUTLASS library is not usable here; ``cutlass`` raises when the library is not usable."""
    if lib == "cublas":
        return CUBLAS
    key = (device.index, role, m, n, k, lib)
    if key in _CHOICES:
        return _CHOICES[key]
    choice, reason = decide_gemm(role, m, n, k, lib, device)
    if choice.library == "cublas" and "not in this library build" in reason:
        log.warning("fp8: %s %dx%dx%d: %s; using cuBLAS", role, m, n, k, reason)
    log.info("fp8: %s %dx%dx%d on %s%s", role, m, n, k, choice.library, f" ({choice.config})" if choice.config else "")
    _CHOICES[key] = choice
    return choice


# The GEMM calls are torch ops (trainer.fp8.ops): torch.compile (Dynamo) cannot trace F.scaled_mm's builtin
# (`torch._scaled_mm_v2`) and would break the graph at every linear; as ops with shape-only
# fake implementations they sit in one compiled graph as opaque kernels. The library is chosen inside,
# at run time, from the real shapes.


@op("mm_1x128_128x128", mutates_args=())
def _mm_act_weight(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, pad_block_scales: bool,
    out_dtype: torch.dtype, lib: str, role: str,
) -> torch.Tensor:
    """``a (M, R) @ b (N, R)^T``: ``a`` scaled per 1x128 along R, ``b`` per 128x128 block with
    ``scale_b`` given as (N/128, R/128)."""
    choice = choose_gemm(role, a.shape[0], b.shape[0], a.shape[1], lib, a.device)
    if choice.library == "cutlass":
        y = cutlass_gemm.launch_act_weight(a, b, scale_a, scale_b, choice.config, cutlass_gemm.RASTER[choice.raster],
                                           choice.swizzle)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return F.scaled_mm(
        a.contiguous(), b.contiguous().t(),
        colmajor(scale_a), _BW1x128,
        block_scale_operand(scale_b, pad_block_scales), _BW128x128,
        output_dtype=out_dtype,
    )


@_mm_act_weight.register_fake
def _(a, b, scale_a, scale_b, pad_block_scales, out_dtype, lib, role):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _act_act_product(a, b, scale_a, scale_b, out_dtype, lib, cublas_fp32_out) -> torch.Tensor:
    """``a (N, R) @ b (K, R)^T`` with both operands scaled per 1x128 along R (Wgrad: R = tokens).
    cuBLAS writes float32 only where the probe found it can (``cublas_fp32_out``; else BF16, cast).
    The body of the op below, and of the accumulating op's cuBLAS path (one dispatch, not two)."""
    choice = choose_gemm("wgrad", a.shape[0], b.shape[0], a.shape[1], lib, a.device)
    if choice.library == "cutlass" and out_dtype in (torch.float32, torch.bfloat16):
        return cutlass_gemm.launch_act_act(a, b, scale_a, scale_b, choice.config, out_dtype,
                                           cutlass_gemm.RASTER[choice.raster], choice.swizzle)
    want = torch.bfloat16 if (out_dtype == torch.float32 and not cublas_fp32_out) else out_dtype
    y = F.scaled_mm(
        a.contiguous(), b.contiguous().t(),
        colmajor(scale_a), _BW1x128,
        colmajor(scale_b), _BW1x128,
        output_dtype=want,
    )
    return y if y.dtype == out_dtype else y.to(out_dtype)


@op("mm_1x128_1x128", mutates_args=())
def _mm_act_act(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out_dtype: torch.dtype,
    lib: str, cublas_fp32_out: bool,
) -> torch.Tensor:
    """:func:`_act_act_product` as an op."""
    return _act_act_product(a, b, scale_a, scale_b, out_dtype, lib, cublas_fp32_out)


@_mm_act_act.register_fake
def _(a, b, scale_a, scale_b, out_dtype, lib, cublas_fp32_out):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@op("mm_1x128_1x128_into", mutates_args=("out",))
def _mm_act_act_into(
    a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, out: torch.Tensor,
    lib: str, cublas_fp32_out: bool,
) -> None:
    """``out += a (N, R) @ b (K, R)^T`` into a float32 ``out`` (Wgrad into the fp32 gradient): a CUTLASS
    config adds in its epilogue (beta = 1, so no product is written and read back), cuBLAS's product is added."""
    choice = choose_gemm("wgrad", a.shape[0], b.shape[0], a.shape[1], lib, a.device)
    if choice.library == "cutlass":
        cutlass_gemm.launch_act_act_into(a, b, scale_a, scale_b, out, 1.0, choice.config,
                                         cutlass_gemm.RASTER[choice.raster], choice.swizzle)
    else:
        out.add_(_act_act_product(a, b, scale_a, scale_b, torch.float32, lib, cublas_fp32_out))


@_mm_act_act_into.register_fake
def _(a, b, scale_a, scale_b, out, lib, cublas_fp32_out):
    return None


def scaled_mm_fprop(xq, xs, wq, ws, caps: ScaledMmCaps, out_dtype=torch.bfloat16, lib: str = "cublas") -> torch.Tensor:
    """``y (M, N) = x (M, K) w (N, K)^T``. ``ws`` is (N/128, K/128)."""
    return _mm_act_weight(xq, wq, xs, ws, caps.pad_block_scales, out_dtype, lib, "fprop")


def scaled_mm_dgrad(dyq, dys, wtq, ws, caps: ScaledMmCaps, out_dtype=torch.bfloat16, lib: str = "cublas") -> torch.Tensor:
    """``dx (M, K) = dy (M, N) w (N, K)``; ``wtq`` is the row-major (K, N) transposed copy of ``wq``
    and ``ws`` the (N/128, K/128) block scales of ``w``."""
    return _mm_act_weight(dyq, wtq, dys, ws.t(), caps.pad_block_scales, out_dtype, lib, "dgrad")


def scaled_mm_wgrad(dytq, dyts, xtq, xts, caps: ScaledMmCaps, out_dtype=torch.float32, lib: str = "cublas") -> torch.Tensor:
    """``dw (N, K) = dy^T (N, M) x (M, K)``; ``dytq`` (N, M) and ``xtq`` (K, M) are quantized along M."""
    return _mm_act_act(dytq, xtq, dyts, xts, out_dtype, lib, caps.wgrad_fp32_out)


def scaled_mm_wgrad_into(dytq, dyts, xtq, xts, out: torch.Tensor, caps: ScaledMmCaps, lib: str = "cublas") -> None:
    """``out (N, K) += dy^T x`` in place, ``out`` float32 (as :func:`scaled_mm_wgrad`, accumulated)."""
    _mm_act_act_into(dytq, xtq, dyts, xts, out, lib, caps.wgrad_fp32_out)


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _probe_operands(device, m, k, n, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    # magnitudes spread over many binades, per row and per column, so that a scale applied to the
    # wrong group or block shows up as a large error
    x = torch.randn(m, k, device=device, generator=gen) * torch.exp2(
        torch.randint(-6, 7, (m, 1), device=device, generator=gen).float()
    )
    w = torch.randn(n, k, device=device, generator=gen) * torch.exp2(
        torch.randint(-6, 7, (1, k), device=device, generator=gen).float()
    )
    return x.to(torch.bfloat16), w


def probe_scaled_mm(device: torch.device | str | None = None) -> ScaledMmCaps:
    """Find out once per device whether blockwise ``F.scaled_mm`` runs and is right, and which scale
    layout variants it takes. Never raises: a failure is recorded in ``reason``."""
    device = torch.device(device if device is not None else "cuda")
    if device.type != "cuda":
        return ScaledMmCaps(False, "not a CUDA device")
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = ("cuda", index)
    if key in _CAPS:
        return _CAPS[key]
    caps = _probe(torch.device("cuda", index))
    _CAPS[key] = caps
    log.info("fp8: F.scaled_mm blockwise on cuda:%d: %s", index, caps)
    return caps


def _probe(device: torch.device) -> ScaledMmCaps:
    if not hasattr(F, "scaled_mm") or not hasattr(F, "ScalingType"):
        return ScaledMmCaps(False, f"torch {torch.__version__} has no F.scaled_mm")
    if not hasattr(F.ScalingType, "BlockWise128x128"):
        return ScaledMmCaps(False, f"torch {torch.__version__} F.scaled_mm lacks BlockWise128x128")
    stage = "fprop"
    try:
        # K = 640: 5 reduction blocks, so the rounding of 128x128 scale operands shows
        m, k, n = 256, 640, 384
        x, w = _probe_operands(device, m, k, n)
        xq, xs = quantize_1x128(x)
        wq, ws = quantize_128x128(w)
        ref = emulated_fprop(xq, xs, wq, ws)
        pad_choice, errors = None, []
        for pad in (True, False):
            try:
                y = scaled_mm_fprop(xq, xs, wq, ws, ScaledMmCaps(True, pad_block_scales=pad))
                err = _relerr(y, ref)
                if err < 2e-2:
                    pad_choice = pad
                    break
                errors.append(f"pad={pad}: rel. error {err:.2e}")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"pad={pad}: {type(exc).__name__}: {str(exc)[:160]}")
        if pad_choice is None:
            return ScaledMmCaps(False, "fprop probe failed: " + "; ".join(errors))
        caps = ScaledMmCaps(True, "ok", pad_block_scales=pad_choice)
        stage = "dgrad"
        dy = torch.randn(m, n, device=device).to(torch.bfloat16)
        dyq, dys = quantize_1x128(dy)
        dx = scaled_mm_dgrad(dyq, dys, wq.t().contiguous(), ws, caps)
        err = _relerr(dx, emulated_dgrad(dyq, dys, wq, ws))
        if err > 2e-2:
            return ScaledMmCaps(False, f"dgrad probe: rel. error {err:.2e}")
        stage = "wgrad"  # both operands along the tokens; float32 output if it is accepted
        dytq, dyts = quantize_1x128(dy.t())
        xtq, xts = quantize_1x128(x.t())
        ref_w = emulated_wgrad(dytq, dyts, xtq, xts)
        fp32_ok = False
        try:
            dw = scaled_mm_wgrad(dytq, dyts, xtq, xts, dataclasses.replace(caps, wgrad_fp32_out=True))
            fp32_ok = dw.dtype == torch.float32 and _relerr(dw, ref_w) < 1e-3
        except Exception:  # noqa: BLE001
            fp32_ok = False
        caps = dataclasses.replace(caps, wgrad_fp32_out=fp32_ok)
        dw = scaled_mm_wgrad(dytq, dyts, xtq, xts, caps, out_dtype=torch.bfloat16)
        err = _relerr(dw, ref_w)
        if err > 2e-2:
            return ScaledMmCaps(False, f"wgrad probe: rel. error {err:.2e}")
        return caps
    except Exception as exc:  # noqa: BLE001
        return ScaledMmCaps(False, f"{stage} probe raised {type(exc).__name__}: {str(exc)[:200]}")

