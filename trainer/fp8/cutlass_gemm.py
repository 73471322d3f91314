"""Blockwise-FP8 GEMMs on CUTLASS's Hopper kernels (``csrc/blockwise_gemm.cu``), loaded with ctypes.

The kernels are CUTLASS's warp-specialized FP8 mainloops with blockwise scale promotion
(``KernelTmaWarpSpecialized{Cooperative,Pingpong}FP8Blockwise``): the pingpong schedule alternates
two consumer warpgroups on different tiles; the ``pipelined_*`` configs replace the cooperative
mainloop's ``mma()`` with ``csrc/pipelined_promotion.hpp``, whose warpgroups promote one k-tile while
the next one's WGMMAs run (issue 16). The ``deepgemm_*`` configs run DeepGEMM's Hopper kernels
(``csrc/deepgemm_configs.hpp``; built where the build is given a DeepGEMM checkout): its act_weight
kernels are compiled for one (N, K) each (:func:`config_shape`), its act_act kernel for any shape;
they take no ``raster``/``swizzle`` (:func:`takes_schedule`). The library is a plain C shared object built ahead of time
(``python -m trainer.fp8.csrc.build --out .gpu_build``) with no torch headers, so it does not depend
on torch's C++ ABI; this module finds it, checks that its exported signatures are the ones written
here (:data:`_API` against ``purokit_fp8_abi()``), and wraps the calls as torch ops (:mod:`trainer.fp8.ops`). The same
library holds the CUDA activation quantizers (``csrc/quantize.cu``), which :mod:`trainer.fp8.triton_kernels`'
ops call through :func:`quant_act_into` and its two SwiGLU siblings.

Where the library is looked for: ``$PUROKIT_FP8_GEMM_LIB`` (a path to the .so; when set, only that),
else ``.gpu_build/libpurokit_fp8_gemm.so`` under the repository root, else
``~/.cache/purokit/libpurokit_fp8_gemm.so``.

Operands and scales are laid out as :mod:`trainer.fp8.triton_kernels` writes them; every GEMM takes
both operands K-major ("TN") and M, N, K multiples of 128:

===========  ==========================  ================================  ==========  ===========
kind         A, its scales               B, its scales                     output      serves
===========  ==========================  ================================  ==========  ===========
act_weight   (M, K), (M, K/128) 1x128    (N, K), (N/128, K/128) 128x128    bf16        Fprop/Dgrad
act_act      (M, K), (M, K/128) 1x128    (N, K), (N, K/128) 1x128          fp32 [+= C]  Wgrad
===========  ==========================  ================================  ==========  ===========

1x128 scales are used without a copy when stored column-major (``quant_act``'s ``s``/``st``);
128x128 scales when row-major (``quant_weight``'s ``ws``). Dgrad's B is the transposed weight copy
``wtq`` (K, N), whose block scales are ``ws.t()``: :func:`dgrad` passes its contiguous copy (16 KB
for the largest 1.7B weight).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path

import torch

from trainer.fp8.ops import op
from trainer.fp8.quantize import ceil_div, colmajor
from trainer.fp8.recipe import GROUP

LIB_ENV = "PUROKIT_FP8_GEMM_LIB"
LIB_NAME = "libpurokit_fp8_gemm.so"
REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("csrc") / "blockwise_gemm.cu"
ABI_VERSION = 4

KINDS = ("act_weight", "act_act", "act_act_bf16")
# statuses of a config the library holds a name for but no kernel: a stub of a partial build (--only),
# a DeepGEMM config built without DeepGEMM (csrc/status.h)
NOT_BUILT = (100, 108)
RASTER = {"heuristic": 0, "m": 1, "n": 2}

# The exported C API, mirrored by PUROKIT_FP8_API in csrc/blockwise_gemm.cu; checked against the
# library's own stringified table when it is loaded (and against the source by the CPU tests).
_API: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("int", "purokit_fp8_abi_version", ()),
    ("const char*", "purokit_fp8_abi", ()),
    ("int", "purokit_fp8_config_count", ()),
    ("const char*", "purokit_fp8_config_name", ("int config",)),
    ("const char*", "purokit_fp8_config_kind", ("int config",)),
    ("int", "purokit_fp8_config_shape", ("int config", "int* n", "int* k")),
    ("const char*", "purokit_fp8_status_string", ("int status",)),
    ("int", "purokit_fp8_workspace_size", (
        "int config", "int m", "int n", "int k", "int raster", "int swizzle", "size_t* out",
    )),
    ("int", "purokit_fp8_act_weight", (
        "int config", "const void* a", "const void* b", "const float* sa", "const float* sb", "void* d",
        "int m", "int n", "int k", "int raster", "int swizzle", "void* workspace", "size_t workspace_size",
        "cudaStream_t stream",
    )),
    ("int", "purokit_fp8_act_act", (
        "int config", "const void* a", "const void* b", "const float* sa", "const float* sb", "const float* c",
        "void* d", "float beta", "int m", "int n", "int k", "int raster", "int swizzle", "void* workspace",
        "size_t workspace_size", "cudaStream_t stream",
    )),
    ("int", "purokit_fp8_quant_act", (
        "const void* x", "int m", "int k", "long ldx", "int pow2", "void* q", "float* s", "void* qt", "float* st",
        "int m_pad", "cudaStream_t stream",
    )),
    ("int", "purokit_fp8_swiglu_quant", (
        "const void* gu", "int m", "int f", "long ldg", "int pow2", "void* q", "float* s", "void* qt", "float* st",
        "int m_pad", "cudaStream_t stream",
    )),
    ("int", "purokit_fp8_swiglu_bwd_quant", (
        "const void* gu", "const void* dh", "int m", "int f", "long ldg", "long ldd", "int pow2", "void* q",
        "float* s", "void* qt", "float* st", "int m_pad", "cudaStream_t stream",
    )),
)

_CTYPES = {
    "void": None,
    "int": ctypes.c_int,
    "long": ctypes.c_long,
    "float*": ctypes.c_void_p,
    "float": ctypes.c_float,
    "size_t": ctypes.c_size_t,
    "size_t*": ctypes.POINTER(ctypes.c_size_t),
    "int*": ctypes.POINTER(ctypes.c_int),
    "const char*": ctypes.c_char_p,
    "const void*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
    "const float*": ctypes.c_void_p,
    "cudaStream_t": ctypes.c_void_p,
}


def _param_type(param: str) -> str:
    """C type of a ``"type name"`` parameter (``"const float* sa"`` -> ``"const float*"``)."""
    return param.rsplit(" ", 1)[0]


def abi_string(api=_API) -> str:
    """The API table as the C side stringifies it, without whitespace (compared whitespace-free)."""
    parts = [f"{ret} {name}({', '.join(params) or 'void'});" for ret, name, params in api]
    return re.sub(r"\s+", "", "".join(parts))


class Library:
    """The loaded .so with its signatures set and its config table read."""

    def __init__(self, path: Path):
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        for ret, name, params in _API:
            fn = getattr(self.dll, name)
            fn.restype = _CTYPES[ret]
            fn.argtypes = [_CTYPES[_param_type(p)] for p in params]
        version = self.dll.purokit_fp8_abi_version()
        if version != ABI_VERSION:
            raise OSError(f"{path}: ABI version {version}, this module speaks {ABI_VERSION}: rebuild it")
        got = re.sub(r"\s+", "", self.dll.purokit_fp8_abi().decode())
        if got != abi_string():
            raise OSError(f"{path}: exported signatures differ from trainer.fp8.cutlass_gemm._API: rebuild it")
        count = self.dll.purokit_fp8_config_count()
        self.configs: dict[str, dict[str, int]] = {k: {} for k in KINDS}
        self.shapes: dict[int, tuple[int, int] | None] = {}  # index -> the only (N, K) it runs, or None
        n, k, size = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        for i in range(count):
            if self.dll.purokit_fp8_config_shape(i, ctypes.byref(n), ctypes.byref(k)) != 0:
                raise OSError(f"{path}: purokit_fp8_config_shape({i}) failed")
            self.shapes[i] = (n.value, k.value) if n.value else None
            # a config left out of the build (--only, or DeepGEMM's without a checkout) is not offered
            status = self.dll.purokit_fp8_workspace_size(i, 256, n.value or 256, k.value or 256, 0, 1,
                                                         ctypes.byref(size))
            if status in NOT_BUILT:
                continue
            kind = self.dll.purokit_fp8_config_kind(i).decode()
            self.configs[kind][self.dll.purokit_fp8_config_name(i).decode()] = i

    def status(self, status: int) -> str:
        return self.dll.purokit_fp8_status_string(status).decode()


def library_candidates() -> list[Path]:
    """Where the library is looked for, in order (only ``$PUROKIT_FP8_GEMM_LIB`` when it is set)."""
    return list(_candidates(os.environ.get(LIB_ENV), os.environ.get("HOME")))


@functools.lru_cache(maxsize=None)
def _candidates(env: str | None, home: str | None) -> tuple[Path, ...]:
    # keyed by the variables they come from: every GEMM and quantizer call asks for the library, and building
    # and hashing these paths each time took ~9% of an eager FP8 linear's host time (cProfile on the H200)
    if env:
        return (Path(env).expanduser(),)
    return (REPO_ROOT / ".gpu_build" / LIB_NAME, Path.home() / ".cache" / "purokit" / LIB_NAME)


@functools.lru_cache(maxsize=None)
def _load(candidates: tuple[Path, ...]) -> tuple[Library | None, str]:
    for path in candidates:
        if path.is_file():
            try:
                return Library(path), f"loaded {path}"
            except (OSError, AttributeError) as exc:
                return None, f"cannot load {path}: {exc}"
    where = ", ".join(map(str, candidates))
    return None, (f"no {LIB_NAME} at {where}: build it with `make fp8-gemm-lib` (or `pip install -e "
                  "'.[fp8-build]'` and `python -m trainer.fp8.csrc.build --out .gpu_build`; no GPU needed)")


def library() -> tuple[Library | None, str]:
    """The loaded library (or None) and a sentence saying which file it is or why there is none."""
    return _load(_candidates(os.environ.get(LIB_ENV), os.environ.get("HOME")))


def available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether the CUTLASS GEMMs can run on ``device`` (default: the current CUDA device), and why not."""
    lib, reason = library()
    if lib is None:
        return False, reason
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        return False, f"{dev} is not a CUDA device"
    return _available_on(lib, reason, dev.index if dev.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _available_on(lib: Library, reason: str, index: int) -> tuple[bool, str]:
    # once per library and device: every eager GEMM and quantizer call asks, and the device-capability query
    # ran each time
    cap = torch.cuda.get_device_capability(index)
    if cap != (9, 0):
        return False, f"the library is built for sm_90a (Hopper), cuda:{index} is sm_{cap[0]}{cap[1]}"
    return True, reason


def configs(kind: str, n: int | None = None, k: int | None = None) -> list[str]:
    """Names of the library's configs of ``kind`` (``act_weight``, ``act_act``, ``act_act_bf16``); with
    ``n`` and ``k``, only those that run that (N, K) (DeepGEMM's act_weight configs are each compiled
    for one: :func:`config_shape`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown GEMM kind {kind!r}: expected one of {KINDS}")
    lib, _ = library()
    if lib is None:
        return []
    return [c for c, i in lib.configs[kind].items() if n is None or lib.shapes[i] in (None, (n, k))]


def config_shape(kind: str, config: str) -> tuple[int, int] | None:
    """The only (N, K) ``config`` runs, or None where it runs any shape."""
    lib, reason = library()
    if lib is None:
        raise RuntimeError(f"cutlass fp8: {reason}")
    return lib.shapes[_config_index(lib, kind, config)]


def takes_schedule(config: str) -> bool:
    """Whether ``raster``/``swizzle`` change what ``config`` runs (CUTLASS's tile schedulers; DeepGEMM's
    kernels order their tiles themselves)."""
    return not config.startswith("deepgemm_")


# ----------------------------------------------------------------------------------------------
# Argument checks (pure: no library, no GPU)
# ----------------------------------------------------------------------------------------------


def check_operands(kind: str, a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor) -> tuple[int, int, int]:
    """(M, N, K) of ``a (M, K) @ b (N, K)^T`` after checking dtypes, ranks and scale shapes; a
    ValueError names the shapes when the problem is not one the kernels take."""
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"cutlass fp8 {kind}: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    for name, t in (("a", a), ("b", b)):
        if t.dtype != torch.float8_e4m3fn:
            raise ValueError(f"cutlass fp8 {kind}: {name} must be float8_e4m3fn, got {t.dtype}")
    (m, k), (n, kb) = a.shape, b.shape
    if k != kb:
        raise ValueError(f"cutlass fp8 {kind}: a {tuple(a.shape)} and b {tuple(b.shape)} differ in K")
    if m % GROUP or n % GROUP or k % GROUP or not (m and n and k):
        raise ValueError(
            f"cutlass fp8 {kind}: (M, N, K) = ({m}, {n}, {k}) must be positive multiples of {GROUP} "
            "(pad the tokens to 128, as the Wgrad operands already are)"
        )
    want_sb = (n // GROUP, k // GROUP) if kind == "act_weight" else (n, k // GROUP)
    for name, t, want in (("sa", sa, (m, k // GROUP)), ("sb", sb, want_sb)):
        if tuple(t.shape) != want or t.dtype != torch.float32:
            raise ValueError(
                f"cutlass fp8 {kind}: {name} must be float32 {want} for (M, N, K) = ({m}, {n}, {k}), "
                f"got {t.dtype} {tuple(t.shape)}"
            )
    return m, n, k


def _config_index(lib: Library, kind: str, config: str) -> int:
    try:
        return lib.configs[kind][config]
    except KeyError:
        raise ValueError(f"cutlass fp8: no {kind} config {config!r}; the library has {list(lib.configs[kind])}") from None


def _require(a: torch.Tensor, tensors) -> Library:
    lib, reason = library()
    if lib is None:
        raise RuntimeError(f"cutlass fp8 GEMMs unavailable: {reason}")
    if not a.is_cuda:
        raise RuntimeError("cutlass fp8 GEMMs need CUDA tensors")
    for t in tensors:
        if t.device != a.device:
            raise RuntimeError(f"cutlass fp8: operands on {a.device} and {t.device}")
    return lib


_WORKSPACE: dict[tuple[int, ...], int] = {}


def _workspace(lib: Library, index: int, m: int, n: int, k: int, raster: int, swizzle: int,
               device) -> tuple[torch.Tensor | None, int]:
    """A workspace for one call (none for most configs; stream-K keeps partial tiles in it)."""
    key = (index, m, n, k, raster, swizzle)
    if key not in _WORKSPACE:
        size = ctypes.c_size_t(0)
        status = lib.dll.purokit_fp8_workspace_size(index, m, n, k, raster, swizzle, ctypes.byref(size))
        if status:
            raise RuntimeError(f"cutlass fp8 workspace size for (M, N, K) = ({m}, {n}, {k}): {lib.status(status)}")
        _WORKSPACE[key] = size.value
    size = _WORKSPACE[key]
    return (torch.empty(size, dtype=torch.uint8, device=device), size) if size else (None, 0)


def _ptr(t: torch.Tensor | None):
    return t.data_ptr() if t is not None else None


def _fail(lib: Library, status: int, kind: str, config: str, m: int, n: int, k: int) -> None:
    if status:
        raise RuntimeError(
            f"cutlass fp8 {kind} config {config!r} on (M, N, K) = ({m}, {n}, {k}) failed: "
            f"{lib.status(status)} (status {status})"
        )


# ----------------------------------------------------------------------------------------------
# Custom ops (opaque to torch.compile, shape-only fake implementations, as gemm.py's)
# ----------------------------------------------------------------------------------------------


_CURRENT_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds


def _raw_stream(index: int) -> int:
    """The handle of the current stream of CUDA device ``index`` (what Inductor's generated code reads)."""
    if _CURRENT_RAW_STREAM is not None:
        return _CURRENT_RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def _launch(lib: Library, name: str, args: tuple, on: torch.Tensor) -> int:
    """Call the entry point ``name`` with ``args`` then the current stream of ``on``'s device, with that
    device current (the kernels launch on the current device, whose SM count sizes CUTLASS's grid). The
    device is switched only where it is not already current, and the raw stream handle is read without
    making a ``torch.cuda.Stream``: an eager FP8 linear makes six such calls a step, and their host path
    outlasted the GPU work at (2048, 2048) (benchmarks/RESULTS.md)."""
    index = on.device.index
    if index == torch.cuda.current_device():
        return getattr(lib.dll, name)(*args, _raw_stream(index))
    with torch.cuda.device(index):
        return getattr(lib.dll, name)(*args, _raw_stream(index))


# The op bodies are plain functions as well: gemm.py's GEMM ops call them from inside their own op, which
# would otherwise pay the dispatch twice.


def launch_act_weight(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, config: str,
                      raster: int, swizzle: int) -> torch.Tensor:
    """:func:`act_weight` without the op's dispatch (``raster`` as :data:`RASTER`'s number)."""
    m, n, k = check_operands("act_weight", a, b, sa, sb)
    lib = _require(a, (b, sa, sb))
    index = _config_index(lib, "act_weight", config)
    a, b, sa, sb = a.contiguous(), b.contiguous(), colmajor(sa), sb.contiguous()
    d = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    ws, ws_size = _workspace(lib, index, m, n, k, raster, swizzle, a.device)
    status = _launch(lib, "purokit_fp8_act_weight", (
        index, _ptr(a), _ptr(b), _ptr(sa), _ptr(sb), _ptr(d), m, n, k, raster, swizzle, _ptr(ws), ws_size,
    ), a)
    _fail(lib, status, "act_weight", config, m, n, k)
    return d


@op("cutlass_act_weight", mutates_args=())
def _act_weight_op(
    a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, config: str, raster: int, swizzle: int
) -> torch.Tensor:
    return launch_act_weight(a, b, sa, sb, config, raster, swizzle)


@_act_weight_op.register_fake
def _(a, b, sa, sb, config, raster, swizzle):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16)


def _act_act_call(a, b, sa, sb, c, d, beta, kind, config, raster, swizzle) -> None:
    m, n, k = check_operands(kind, a, b, sa, sb)
    lib = _require(a, (b, sa, sb, d))
    index = _config_index(lib, kind, config)
    a, b, sa, sb = a.contiguous(), b.contiguous(), colmajor(sa), colmajor(sb)
    ws, ws_size = _workspace(lib, index, m, n, k, raster, swizzle, a.device)
    status = _launch(lib, "purokit_fp8_act_act", (
        index, _ptr(a), _ptr(b), _ptr(sa), _ptr(sb), _ptr(c), _ptr(d), beta, m, n, k, raster, swizzle,
        _ptr(ws), ws_size,
    ), a)
    _fail(lib, status, kind, config, m, n, k)


def launch_act_act(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, config: str,
                   out_dtype: torch.dtype, raster: int, swizzle: int) -> torch.Tensor:
    """:func:`act_act` into a new tensor, without the op's dispatch (``raster`` as :data:`RASTER`'s number)."""
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"cutlass fp8 act_act: out_dtype must be float32 or bfloat16, got {out_dtype}")
    kind = "act_act" if out_dtype == torch.float32 else "act_act_bf16"
    lib, _ = library()
    if lib is not None and kind == "act_act_bf16" and config not in lib.configs[kind]:
        # an fp32-output config (what the GEMM table names) asked for a BF16 result: its result rounded,
        # as the bf16 epilogue would round it
        kind = "act_act"
    d = torch.empty((a.shape[0], b.shape[0]), dtype=torch.float32 if kind == "act_act" else out_dtype, device=a.device)
    _act_act_call(a, b, sa, sb, None, d, 0.0, kind, config, raster, swizzle)
    return d if d.dtype == out_dtype else d.to(out_dtype)


@op("cutlass_act_act", mutates_args=())
def _act_act_op(
    a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, config: str, out_dtype: torch.dtype,
    raster: int, swizzle: int,
) -> torch.Tensor:
    return launch_act_act(a, b, sa, sb, config, out_dtype, raster, swizzle)


@_act_act_op.register_fake
def _(a, b, sa, sb, config, out_dtype, raster, swizzle):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def launch_act_act_into(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out: torch.Tensor,
                        beta: float, config: str, raster: int, swizzle: int) -> None:
    """``out = a b^T + beta * out`` in place (:func:`act_act` with ``out``), without the op's dispatch."""
    want = (a.shape[0], b.shape[0])
    if out.dtype != torch.float32 or tuple(out.shape) != want or not out.is_contiguous():
        raise ValueError(
            f"cutlass fp8 act_act: out must be a contiguous float32 {want} tensor, got {out.dtype} "
            f"{tuple(out.shape)} (contiguous: {out.is_contiguous()})"
        )
    _act_act_call(a, b, sa, sb, out, out, beta, "act_act", config, raster, swizzle)


@op("cutlass_act_act_accumulate", mutates_args=("out",))
def _act_act_accumulate_op(
    a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out: torch.Tensor, beta: float,
    config: str, raster: int, swizzle: int,
) -> None:
    launch_act_act_into(a, b, sa, sb, out, beta, config, raster, swizzle)


@_act_act_accumulate_op.register_fake
def _(a, b, sa, sb, out, beta, config, raster, swizzle):
    return None


# ----------------------------------------------------------------------------------------------
# Public calls
# ----------------------------------------------------------------------------------------------

DEFAULT_ACT_WEIGHT = "coop_128x128_c1x1"
DEFAULT_ACT_ACT = "coop_128x128_c1x1"


def act_weight(a, b, sa, sb, config: str = DEFAULT_ACT_WEIGHT, raster: str = "heuristic", swizzle: int = 1):
    """``a (M, K) @ b (N, K)^T`` in bf16: ``a`` scaled per 1x128 along K (``sa`` (M, K/128)), ``b`` per
    128x128 block (``sb`` (N/128, K/128))."""
    return _act_weight_op(a, b, sa, sb, config, RASTER[raster], swizzle)


def act_act(a, b, sa, sb, config: str = DEFAULT_ACT_ACT, out: torch.Tensor | None = None,
            out_dtype: torch.dtype = torch.float32, beta: float = 1.0, raster: str = "heuristic", swizzle: int = 1):
    """``a (M, K) @ b (N, K)^T`` with both operands scaled per 1x128 along K (``sa`` (M, K/128), ``sb``
    (N, K/128)). With ``out`` (float32 (M, N)): ``out = a b^T + beta * out`` in place (the Wgrad that
    accumulates into the fp32 gradient), returning ``out``; else a new ``out_dtype`` tensor."""
    if out is not None:
        _act_act_accumulate_op(a, b, sa, sb, out, beta, config, RASTER[raster], swizzle)
        return out
    return _act_act_op(a, b, sa, sb, config, out_dtype, RASTER[raster], swizzle)


def fprop(xq, xs, wq, ws, config: str = DEFAULT_ACT_WEIGHT, **kw) -> torch.Tensor:
    """``y (M, N) = x (M, K) w (N, K)^T`` (as :func:`trainer.fp8.gemm.scaled_mm_fprop`)."""
    return act_weight(xq, wq, xs, ws, config, **kw)


def dgrad(dyq, dys, wtq, ws, config: str = DEFAULT_ACT_WEIGHT, **kw) -> torch.Tensor:
    """``dx (M, K) = dy (M, N) w (N, K)``; ``wtq`` is the row-major (K, N) copy of ``wq`` and ``ws``
    the (N/128, K/128) scales of ``w`` (their transpose is copied: the kernel reads K-major blocks)."""
    return act_weight(dyq, wtq, dys, ws.t(), config, **kw)


def wgrad(dytq, dyts, xtq, xts, config: str = DEFAULT_ACT_ACT, out: torch.Tensor | None = None,
          out_dtype: torch.dtype = torch.float32, **kw) -> torch.Tensor:
    """``dw (N, K) = dy^T (N, M) x (M, K)``, both quantized along the tokens M; with ``out`` the
    product is added into it (``out += dw``)."""
    return act_act(dytq, xtq, dyts, xts, config, out=out, out_dtype=out_dtype, **kw)


# ----------------------------------------------------------------------------------------------
# The activation quantizers of csrc/quantize.cu (same library): outputs allocated by the caller
# (trainer.fp8.triton_kernels' ops, which also hold the Triton implementation of the same contract)
# ----------------------------------------------------------------------------------------------


def quantizers_available(x: torch.Tensor) -> bool:
    """Whether the CUDA quantizers can take ``x``: a BF16 tensor on an sm_90 GPU, with the library loaded."""
    return x.is_cuda and x.dtype == torch.bfloat16 and available(x.device)[0]


def _quant_call(name: str, args: tuple, x: torch.Tensor, qt, what: str) -> None:
    """One quantizer entry point: ``args`` and then the padded token count (``qt``'s width) and the stream."""
    lib = _require(x, ())
    m_pad = qt.shape[1] if qt is not None else ceil_div(x.shape[0], GROUP) * GROUP
    status = _launch(lib, name, (*args, m_pad), x)
    if status:
        raise RuntimeError(f"cuda fp8 {what}: {lib.status(status)} (status {status})")


def quant_act_into(x: torch.Tensor, pow2: bool, q, s_store, qt, st_store) -> None:
    """Quantize the (M, K) BF16 ``x`` into the row copy ``q``/``s_store`` and the transposed copy
    ``qt``/``st_store`` (``None`` for a copy not wanted), laid out as ``triton_kernels._act_outputs``."""
    m, k = x.shape
    _quant_call("purokit_fp8_quant_act", (
        _ptr(x), m, k, x.stride(0), int(pow2), _ptr(q), _ptr(s_store), _ptr(qt), _ptr(st_store),
    ), x, qt, f"quant_act of ({m}, {k})")


def swiglu_quant_into(gu: torch.Tensor, pow2: bool, q, s_store, qt, st_store) -> None:
    """``silu(gate) * up`` of the stacked (M, 2F) BF16 ``gu``, quantized as :func:`quant_act_into` quantizes."""
    m, f = gu.shape[0], gu.shape[1] // 2
    _quant_call("purokit_fp8_swiglu_quant", (
        _ptr(gu), m, f, gu.stride(0), int(pow2), _ptr(q), _ptr(s_store), _ptr(qt), _ptr(st_store),
    ), gu, qt, f"swiglu_quant of ({m}, {2 * f})")


def swiglu_bwd_quant_into(gu: torch.Tensor, dh: torch.Tensor, pow2: bool, q, s_store, qt, st_store) -> None:
    """``d[gate | up]`` of ``silu(gate) * up`` given ``dh`` (M, F), quantized as an (M, 2F) tensor."""
    m, f = dh.shape
    _quant_call("purokit_fp8_swiglu_bwd_quant", (
        _ptr(gu), _ptr(dh), m, f, gu.stride(0), dh.stride(0), int(pow2), _ptr(q), _ptr(s_store), _ptr(qt),
        _ptr(st_store),
    ), gu, qt, f"swiglu_bwd_quant of ({m}, {2 * f})")
