"""Build ``libpurokit_fp8_gemm.so`` (the CUTLASS blockwise-FP8 GEMMs of ``blockwise_gemm.cu`` and the
activation quantizers of ``quantize.cu``) ahead of time.

::

    python -m trainer.fp8.csrc.build --out .gpu_build [--jobs 2] [--cutlass DIR] [--deepgemm DIR] [--nvcc PATH]

Needs nvcc >= 12.4 with sm_90a support and a CUTLASS 4.x checkout (``$CUTLASS_DIR``: the folder that
holds ``include/cutlass`` and ``tools/util/include``; no CUTLASS build is needed, it is header-only
here). A DeepGEMM checkout (``$DEEPGEMM_DIR`` or ``--deepgemm``: the folder holding
``deep_gemm/include``, github.com/deepseek-ai/DeepGEMM) is optional: with it the ``deepgemm_*``
configs (deepgemm_configs.hpp) compile DeepGEMM's Hopper kernels; without it they are built as
configs that answer "built without DeepGEMM" and the GEMM table cannot pick them. nvcc is looked
for as ``--nvcc``, ``$NVCC``, ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on ``PATH``, and the
``nvidia-cuda-nvcc`` pip wheel. The source is compiled once per kernel config (one object each,
``--jobs`` at a time: a CUTLASS one takes ~1 min and ~4 GB of memory, a DeepGEMM one ~15 s) plus once
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


def find_nvcc(explicit: str | None = None) -> str:
    candidates = [explicit, os.environ.get("NVCC")]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    candidates.append(shutil.which("nvcc"))
    purelib = Path(sysconfig.get_paths()["purelib"])
    candidates += [str(p) for p in sorted(purelib.glob("nvidia/cu*/bin/nvcc"))]
    candidates.append(str(purelib / "nvidia" / "cuda_nvcc" / "bin" / "nvcc"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "nvcc not found: pass --nvcc, set $NVCC or $CUDA_HOME, put nvcc on PATH, or "
        "`pip install nvidia-cuda-nvcc==13.0.*`"
    )


def find_cutlass(explicit: str | None = None) -> Path:
    root = explicit or os.environ.get("CUTLASS_DIR")
    if not root:
        raise FileNotFoundError(
            "CUTLASS not found: set $CUTLASS_DIR (or --cutlass) to a CUTLASS 4.x checkout holding "
            "include/cutlass and tools/util/include, e.g. `git clone https://github.com/NVIDIA/cutlass`"
        )
    root = Path(root)
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


def build(out: Path, jobs: int = 1, cutlass: str | None = None, nvcc: str | None = None,
          only: list[int] | None = None, deepgemm: str | None = None) -> Path:
    """Compile what is not cached, link, and put the library at ``out/libpurokit_fp8_gemm.so``."""
    nvcc_path = find_nvcc(nvcc)
    root = find_cutlass(cutlass)
    dg_root = find_deepgemm(deepgemm)
    dg_version = deepgemm_version(dg_root)
    nvcc_version = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, check=True).stdout
    cversion = cutlass_version(root)
    source = SOURCE.read_text()
    headers = "".join(SOURCE.with_name(h).read_text() for h in HEADERS)
    dg_headers = headers + SOURCE.with_name(DEEPGEMM_HEADER).read_text()
    rows = config_rows(source)
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
            print(f"  [{'ok' if rc == 0 else 'FAILED'}] config {config} ({name}) in {secs:.0f} s", flush=True)
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
    p.add_argument("--jobs", type=int, default=1, help="nvcc processes at a time (~4 GB of memory each)")
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
