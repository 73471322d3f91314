"""Build ``libpurokit_fp8_gemm.so`` (the CUTLASS blockwise-FP8 GEMMs of ``blockwise_gemm.cu`` and the
activation quantizers of ``quantize.cu``) ahead of time.

::

    python -m trainer.fp8.csrc.build --out .gpu_build [--jobs 0] [--cutlass DIR] [--deepgemm DIR] [--nvcc PATH]

Needs nvcc >= 12.4 with sm_90a support and CUTLASS 4.x's headers (no CUTLASS build: it is
header-only here). Both come from packages, the ``fp8-build`` extra (``pip install -e '.[fp8-build]'``,
what ``make fp8-gemm-lib`` runs): nvcc and the CUDA headers from NVIDIA's ``cuda-toolkit[nvcc,cccl]``
wheels (``nvidia-cuda-nvcc``, ``nvidia-cuda-runtime``, ``nvidia-cuda-crt``, ``nvidia-nvvm``,
``nvidia-cuda-cccl``), CUTLASS from the ``nvidia-cutlass`` wheel (its ``cutlass_library/source``
holds ``include/cutlass`` and ``tools/util/include``). A system toolkit and a checkout still win:
nvcc is looked for as ``--nvcc``, ``$NVCC``, ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on ``PATH``, then the
wheel; CUTLASS as ``--cutlass``, ``$CUTLASS_DIR`` (a checkout), then the wheel. A host C++ compiler
(``g++``) is needed as for any nvcc. A DeepGEMM checkout (``$DEEPGEMM_DIR`` or ``--deepgemm``: the
folder holding ``deep_gemm/include``, github.com/deepseek-ai/DeepGEMM) is optional: with it the
``deepgemm_*`` configs (deepgemm_configs.hpp) compile DeepGEMM's Hopper kernels; without it they are
built as configs that answer "built without DeepGEMM" and the GEMM table cannot pick them. What is
missing is named in one line with the package to install.

The source is compiled once per kernel config (one object each,
``--jobs`` at a time (0: as many as the cores and the available memory at ~4 GB each allow: :func:`auto_jobs`;
a CUTLASS one takes ~1 min and ~4 GB of memory, a DeepGEMM one ~15 s) plus once
for the exported API, and
``quantize.cu`` once (no CUTLASS, seconds); all are linked
with a static CUDA runtime, so the library needs only the driver (``libcuda.so.1``) at run time and
nothing of torch. Objects are cached under ``OUT/obj`` by a hash of what they are built from; the
library is written to a temporary name and renamed, so a reader never sees a partial file.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

SOURCE = Path(__file__).with_name("blockwise_gemm.cu")
# the headers beside it that the source includes (part of every object's cache key), and the one only the
# DeepGEMM rows and the API object compile anything from (part of theirs only: CUTLASS rows instantiate
# none of its templates, so editing it rebuilds them not)
HEADERS = ("pipelined_promotion.hpp", "status.h")
DEEPGEMM_HEADER = "deepgemm_configs.hpp"
# the activation quantizers (no CUTLASS): one more object of the library
QUANT_SOURCE = Path(__file__).with_name("quantize.cu")
QUANT = -2  # its "config" index in the build's work list
LIB_NAME = "libpurokit_fp8_gemm.so"
FLAGS = (
    "-gencode", "arch=compute_90a,code=sm_90a",
    "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG",
    "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
)
# register and spill counts of each kernel in its object's .log (not part of the cache key: no effect on code)
DIAGNOSTICS = ("-Xptxas", "-v")
_CONFIG_ROW = re.compile(r"^\s*X\((\d+),\s*(\d+),\s*\"([^\"]+)\"[^)]*\)", re.M)
_TABLE = re.compile(r"#define PUROKIT_FP8_CONFIGS\(X\)(?:.*\\\n)*.*\n")
# a row whose schedule is one of the DeepGemm shapes (DgAny, DgN4096K2048, ...)
_DEEPGEMM_ROW = re.compile(r'^\s*X\(\d+,\s*\d+,\s*"[^"]+",\s*Dg\w+,')
DEEPGEMM_IMPLS = ("sm90_fp8_gemm_1d2d.cuh", "sm90_fp8_gemm_1d1d.cuh")


def uses_deepgemm(row: str) -> bool:
    """Whether a table row runs one of DeepGEMM's kernels (its schedule is a ``Dg*`` shape)."""
    return bool(_DEEPGEMM_ROW.match(row))


def config_rows(source: str) -> list[tuple[int, str]]:
    """(index, table row) of each kernel config in ``PUROKIT_FP8_CONFIGS``, in order."""
    table = _TABLE.search(source)
    if table is None:
        raise ValueError(f"{SOURCE}: no PUROKIT_FP8_CONFIGS table")
    rows = [(int(m.group(1)), m.group(0).strip()) for m in _CONFIG_ROW.finditer(table.group(0))]
    if [i for i, _ in rows] != list(range(len(rows))):
        raise ValueError(f"{SOURCE}: config indices must be 0..n-1 in order, got {[i for i, _ in rows]}")
    return rows


_COMMENT_LINE = re.compile(r"^[ \t]*//.*\n", re.M)


def object_key(source: str, config: int, row: str, nvcc_version: str, cutlass_version: str,
               headers: str = "") -> str:
    """A config's object depends on the source outside the table, its own row, the headers beside it
    and the tools: adding a row to the table rebuilds only that row's object (and the API object,
    which holds the table), and editing a whole-line comment rebuilds nothing."""
    table = _TABLE.search(source)
    rest = source[: table.start()] + source[table.end():] if table else source
    rest = _COMMENT_LINE.sub("", rest + headers)
    return _digest(rest, row if config >= 0 else table.group(0), nvcc_version, cutlass_version)


def row_key(source: str, config: int, row: str, nvcc_version: str, cutlass_version: str, deepgemm_version: str,
            headers: str, deepgemm_headers: str) -> str:
    """:func:`object_key` with what a row is compiled from: a DeepGEMM row also depends on DeepGEMM's
    checkout and on deepgemm_configs.hpp (``deepgemm_headers``: ``headers`` and it), the API object on that
    header (its table names the DeepGEMM shapes) but not on the checkout, a CUTLASS row on neither."""
    dg = uses_deepgemm(row)
    tools = f"{cutlass_version}+deepgemm {deepgemm_version}" if dg else cutlass_version
    return object_key(source, config, row, nvcc_version, tools, deepgemm_headers if dg or config < 0 else headers)


# what `make fp8-gemm-lib` installs (pyproject.toml's fp8-build extra), named where something is missing
PIP_EXTRA = "pip install -e '.[fp8-build]'"
PIP_TOOLKIT = "pip install 'cuda-toolkit[nvcc,cccl]>=13.0,<14'"
PIP_CUTLASS = "pip install nvidia-cutlass==4.2.0.0"


def _wheel_nvccs() -> list[str]:
    """nvcc of NVIDIA's pip wheels in this environment (``nvidia/cu13/bin/nvcc``, the CUDA 12 layout)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    return [str(p) for p in sorted(purelib.glob("nvidia/cu*/bin/nvcc"))] + [
        str(purelib / "nvidia" / "cuda_nvcc" / "bin" / "nvcc")]


def find_nvcc(explicit: str | None = None) -> str:
    candidates = [explicit, os.environ.get("NVCC")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    candidates.append(shutil.which("nvcc"))
    for c in candidates + _wheel_nvccs():
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        f"nvcc not found (no --nvcc, $NVCC, $CUDA_HOME or nvcc on PATH, no nvidia-cuda-nvcc wheel): {PIP_EXTRA} "
        f"or {PIP_TOOLKIT}"
    )


def check_toolkit(nvcc: str) -> None:
    """Raise, naming the package, where a host C++ compiler is missing or the pip-wheel toolkit of ``nvcc``
    lacks one of its parts, which are separate wheels (a system toolkit comes whole): the CUDA runtime's
    headers (``nvidia-cuda-runtime``), the compiler's own headers (``nvidia-cuda-crt``), its device front
    end (``nvidia-nvvm``) and libcu++ (``nvidia-cuda-cccl``; CUDA 13 keeps it in ``include/cccl``)."""
    if not (shutil.which(os.environ.get("NVCC_CCBIN", "g++")) or shutil.which("c++")):
        raise FileNotFoundError("no host C++ compiler for nvcc (g++): apt-get install g++")
    root = Path(nvcc).resolve().parent.parent
    if root.parent.name != "nvidia":  # not the wheels' nvidia/cu13 layout
        return
    needs = [
        ("include/cuda_runtime.h", "nvidia-cuda-runtime"),
        ("include/crt/host_config.h", "nvidia-cuda-crt"),
        ("nvvm/bin/cicc", "nvidia-nvvm"),
    ]
    for sub, package in needs:
        if not (root / sub).exists():
            raise FileNotFoundError(f"the CUDA toolkit of {nvcc} lacks {sub} (package {package}): {PIP_TOOLKIT}")
    if not any((root / d / "cuda/std/type_traits").exists() for d in ("include/cccl", "include")):
        raise FileNotFoundError(f"the CUDA toolkit of {nvcc} lacks libcu++'s cuda/std (package "
                                f"nvidia-cuda-cccl): {PIP_TOOLKIT}")


def _wheel_cutlass() -> Path | None:
    """The CUTLASS sources the ``nvidia-cutlass`` wheel ships (``cutlass_library/source``), or None. Found
    without importing the package (its ``__init__`` loads the Python interface, which the build needs not)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "source"


def find_cutlass(explicit: str | None = None) -> Path:
    """CUTLASS's headers: ``--cutlass``, ``$CUTLASS_DIR`` (a checkout), else the ``nvidia-cutlass`` wheel."""
    given = explicit or os.environ.get("CUTLASS_DIR")
    root = Path(given) if given else _wheel_cutlass()
    if root is None:
        raise FileNotFoundError(f"CUTLASS not found (no --cutlass, no $CUTLASS_DIR, no nvidia-cutlass wheel): "
                                f"{PIP_EXTRA} or {PIP_CUTLASS}")
    for sub in ("include/cutlass/cutlass.h", "tools/util/include/cutlass/util/packed_stride.hpp"):
        if not (root / sub).is_file():
            raise FileNotFoundError(f"CUTLASS at {root} lacks {sub}")
    return root


def find_deepgemm(explicit: str | None = None) -> Path | None:
    """The DeepGEMM checkout (``--deepgemm``, ``$DEEPGEMM_DIR``), or None where neither is given."""
    root = explicit or os.environ.get("DEEPGEMM_DIR")
    if not root:
        return None
    root = Path(root)
    for impl in DEEPGEMM_IMPLS:
        if not (root / "deep_gemm/include/deep_gemm/impls" / impl).is_file():
            raise FileNotFoundError(f"DeepGEMM at {root} lacks deep_gemm/include/deep_gemm/impls/{impl}")
    return root


def deepgemm_version(root: Path | None) -> str:
    """A digest of DeepGEMM's device headers (what its objects are compiled from), or "none"."""
    if root is None:
        return "none"
    include = root / "deep_gemm/include"
    return _digest(*(f"{p.relative_to(include)}\0{p.read_text()}" for p in sorted(include.rglob("*.cuh"))))


def cutlass_version(root: Path) -> str:
    text = (root / "include/cutlass/version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{k} (\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) if p else "?" for p in parts)


def quant_key(source: str, nvcc_version: str, headers: str = "") -> str:
    """The quantizer object depends on its source, the headers beside it, nvcc and the flags only."""
    return _digest(source + headers, nvcc_version)


def _digest(*parts: str) -> str:
    """A cache key: the parts and the compile flags, hashed."""
    h = hashlib.sha256()
    for part in (*parts, " ".join(FLAGS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


_SPILL = re.compile(r"(\d+) bytes spill stores")


def spilled_bytes(ptxas_log: str) -> int:
    """The most bytes any kernel of an object spills (ptxas -v's "N bytes spill stores" lines), 0 where none."""
    return max((int(n) for n in _SPILL.findall(ptxas_log)), default=0)


def _compile(nvcc: str, cutlass: Path, config: int, obj: Path, log: Path,
             deepgemm: Path | None = None) -> tuple[int, float]:
    if config == QUANT:
        what = ["-c", str(QUANT_SOURCE)]
    else:
        what = [f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools/util/include'}",
                f"-DPUROKIT_FP8_CONFIG={config}", "-c", str(SOURCE)]
        if deepgemm is not None:  # DeepGEMM's own kernels (a row that does not use it compiles without)
            what = [f"-I{deepgemm / 'deep_gemm/include'}", "-DPUROKIT_WITH_DEEPGEMM", *what]
    cmd = [nvcc, *FLAGS, *DIAGNOSTICS, *what, "-o", str(obj) + ".tmp"]
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc == 0:
        os.replace(str(obj) + ".tmp", obj)
    return rc, time.monotonic() - t0


JOB_MEMORY = 4 * 2**30  # what one nvcc of a CUTLASS config takes at its peak


def auto_jobs(cpus: int, available_memory: int) -> int:
    """nvcc processes at a time: one a core, as many as the available memory holds at :data:`JOB_MEMORY` each, >= 1."""
    return max(1, min(cpus, available_memory // JOB_MEMORY))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return JOB_MEMORY


def build(out: Path, jobs: int = 1, cutlass: str | None = None, nvcc: str | None = None,
          only: list[int] | None = None, deepgemm: str | None = None) -> Path:
    """Compile what is not cached, link, and put the library at ``out/libpurokit_fp8_gemm.so``."""
    nvcc_path = find_nvcc(nvcc)
    check_toolkit(nvcc_path)
    root = find_cutlass(cutlass)
    dg_root = find_deepgemm(deepgemm)
    dg_version = deepgemm_version(dg_root)
    nvcc_version = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, check=True).stdout
    cversion = cutlass_version(root)
    source = SOURCE.read_text()
    headers = "".join(SOURCE.with_name(h).read_text() for h in HEADERS)
    dg_headers = headers + SOURCE.with_name(DEEPGEMM_HEADER).read_text()
    rows = config_rows(source)
    jobs = jobs or auto_jobs(os.cpu_count() or 1, _available_memory())
    wanted = [(i, r) for i, r in rows if only is None or i in only]
    objdir = out / "obj"
    objdir.mkdir(parents=True, exist_ok=True)
    todo, objects = [], []
    for config, row in [(-1, "")] + wanted:
        dg = dg_root if uses_deepgemm(row) else None
        key = row_key(source, config, row, nvcc_version, cversion, dg_version, headers, dg_headers)
        obj = objdir / f"cfg{config}-{key}.o"
        objects.append(obj)
        if not obj.exists():
            todo.append((config, obj, dg))
    quant_obj = objdir / f"cfgquant-{quant_key(QUANT_SOURCE.read_text(), nvcc_version, headers)}.o"
    objects.append(quant_obj)
    if not quant_obj.exists():
        todo.append((QUANT, quant_obj, None))
    print(f"fp8 gemm build: nvcc {nvcc_path}, CUTLASS {cversion} at {root}, "
          f"DeepGEMM {f'at {dg_root}' if dg_root else 'not given (its configs answer: not built)'}; "
          f"{len(objects) - len(todo)} objects cached, {len(todo)} to compile, {jobs} at a time", flush=True)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_compile, nvcc_path, root, c, o, o.with_suffix(".log"), dg): (c, o)
                   for c, o, dg in todo}
        for fut in concurrent.futures.as_completed(futures):
            config, obj = futures[fut]
            rc, secs = fut.result()
            name = {-1: "api", QUANT: "quantizers"}.get(config) or rows[config][1]
            spill = spilled_bytes(obj.with_suffix(".log").read_text()) if rc == 0 and config >= 0 else 0
            note = f" (a kernel spills {spill} bytes: slower than measured; CUTLASS {cversion})" if spill else ""
            print(f"  [{'ok' if rc == 0 else 'FAILED'}] config {config} ({name}) in {secs:.0f} s{note}", flush=True)
            if rc != 0:
                failed.append(obj.with_suffix(".log"))
    if failed:
        raise RuntimeError("compilation failed, see " + ", ".join(map(str, failed)))
    if only is None:
        _prune(objdir, objects)
    else:
        # configs left out still need their symbols: link a stub object answering "no such config"
        objects.append(_stubs(out, nvcc_path, [i for i, _ in rows if i not in only]))
    lib = out / LIB_NAME
    tmp = out / f".{LIB_NAME}.{os.getpid()}.tmp"
    subprocess.run([nvcc_path, "-shared", "-cudart", "static", "-o", str(tmp), *map(str, objects)], check=True)
    os.replace(tmp, lib)
    print(f"fp8 gemm build: wrote {lib} ({lib.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return lib


def _prune(objdir: Path, keep: list[Path]) -> None:
    """Drop cached objects and logs no current config uses (older keys, interrupted compiles)."""
    names = {p.name for p in keep} | {p.with_suffix(".log").name for p in keep}
    for path in objdir.glob("cfg*"):
        if path.name not in names:
            path.unlink()


def _stubs(out: Path, nvcc_path: str, missing: list[int]) -> Path:
    """An object defining ``run_config_<i>`` for configs not built, each returning "no such config"."""
    src = out / "obj" / "stubs.cu"
    lines = ["#include <cstddef>", "namespace purokit_fp8 { struct Problem;"]
    lines += [f"int run_config_{i}(Problem const&) {{ return 100; }}" for i in missing]
    lines.append("}")
    src.write_text("\n".join(lines) + "\n")
    obj = src.with_suffix(".o")
    subprocess.run([nvcc_path, "-Xcompiler", "-fPIC", "-c", str(src), "-o", str(obj)], check=True)
    return obj


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the library and the object cache")
    p.add_argument("--jobs", type=int, default=1,
                   help="nvcc processes at a time (~4 GB of memory each; 0: as many as cores and memory allow)")
    p.add_argument("--cutlass", help="CUTLASS checkout (default $CUTLASS_DIR)")
    p.add_argument("--nvcc", help="nvcc to use (default: $NVCC, $CUDA_HOME, PATH, the pip wheel)")
    p.add_argument("--deepgemm", help="DeepGEMM checkout for the deepgemm_* configs (default $DEEPGEMM_DIR; optional)")
    p.add_argument("--only", type=lambda s: [int(x) for x in s.split(",")],
                   help="build only these config indices (comma-separated); the others answer 'no such config'")
    args = p.parse_args(argv)
    try:
        build(args.out, args.jobs, args.cutlass, args.nvcc, args.only, args.deepgemm)
    except (FileNotFoundError, RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"fp8 gemm build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
