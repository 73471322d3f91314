"""Launch shapes of the CUDA activation quantizers (``trainer/fp8/csrc/quantize.cu``), timed in one process.

The library's entry points launch each kernel with one shape (``ActLaunch``, ``SwigluLaunch``,
``SwigluBwdLaunch`` in the source: rows a thread holds, CTAs an SM keeps, grid order). This script
builds the same source with ``-DPUROKIT_QUANT_VARIANTS`` into a small separate library whose
``purokit_quant_launch`` runs any of the shapes in ``PUROKIT_QUANT_LAUNCHES``, and times each one on
the 1.7B shapes (M = 32,768), checking its outputs byte for byte against the library op
(``trainer.fp8.triton_kernels`` with ``impl="cuda"``).

    python benchmarks/fp8_quant_launch.py --out DIR [--lib libquant_launch.so]

``--lib`` takes a library built ahead (``python benchmarks/fp8_quant_launch.py --build-only --lib PATH``
on a machine with nvcc); without it the script builds one with the nvcc ``trainer.fp8.csrc.build`` finds.
Writes ``fp8_quant_launch.json`` under --out and prints a table.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.fp8.csrc import build  # noqa: E402

KERNELS = {"act": 0, "swiglu": 1, "swiglu_bwd": 2}


def build_lib(path: Path) -> Path:
    nvcc = build.find_nvcc()
    cmd = [nvcc, *build.FLAGS, "-DPUROKIT_QUANT_VARIANTS", "-shared", "-cudart", "static",
           "-o", str(path), str(build.QUANT_SOURCE)]
    subprocess.run(cmd, check=True)
    return path


def load(path: Path):
    lib = ctypes.CDLL(str(path))
    lib.purokit_quant_launch_name.restype = ctypes.c_char_p
    lib.purokit_quant_launch_name.argtypes = [ctypes.c_int]
    lib.purokit_quant_launch.restype = ctypes.c_int
    lib.purokit_quant_launch.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 2 + \
        [ctypes.c_long] * 2 + [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p]
    names = []
    while (name := lib.purokit_quant_launch_name(len(names))) is not None:
        names.append(name.decode())
    return lib, names


def run(out: Path, lib_path: Path | None, m: int = 32768) -> dict:
    import torch

    from benchmarks.fp8_gemm import bench_ms, device_info
    from trainer.fp8.triton_kernels import _act_outputs, quant_act, swiglu_bwd_quant, swiglu_quant

    if lib_path is None:
        lib_path = build_lib(Path(tempfile.mkdtemp()) / "libquant_launch.so")
    lib, names = load(lib_path)
    ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731

    def call(v, kernel, a, b, width, out_width):
        q, s, qt, st = outs = _act_outputs(a, m, out_width, True, True)
        status = lib.purokit_quant_launch(v, KERNELS[kernel], ptr(a), ptr(b), m, width, a.stride(0),
                                          b.stride(0) if b is not None else 0, 1, ptr(q), ptr(s), ptr(qt), ptr(st),
                                          qt.shape[1], torch.cuda.current_stream().cuda_stream)
        if status:
            raise RuntimeError(f"{names[v]} {kernel}: status {status}")
        return outs

    f = 6144
    gu = torch.randn(m, 2 * f, device="cuda", dtype=torch.bfloat16)
    dh = torch.randn(m, f, device="cuda", dtype=torch.bfloat16)
    cases = [("act", k, torch.randn(m, k, device="cuda", dtype=torch.bfloat16)) for k in (2048, 4096, 6144)]
    cases += [("swiglu", f, gu), ("swiglu_bwd", f, gu)]
    rows = []
    for kernel, width, a in cases:
        b = dh if kernel == "swiglu_bwd" else None
        out_width = 2 * width if kernel == "swiglu_bwd" else width
        if kernel == "act":
            ref = quant_act(a, True, True, True, impl="cuda")
            nbytes = a.numel() * (2 + 2 + 8 / 128)
        elif kernel == "swiglu":
            ref = swiglu_quant(a, True, True, impl="cuda")
            nbytes = m * f * (4 + 2 + 8 / 128)
        else:
            ref = swiglu_bwd_quant(a, b, True, True, True, impl="cuda")
            nbytes = m * f * (6 + 4 + 16 / 128)
        ref = [ref[0], ref[1].t(), ref[2], ref[3].t()]  # the storages, as _act_outputs lays them out
        for v, name in enumerate(names):
            got = call(v, kernel, a, b, width, out_width)
            same = all(torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                                   y.contiguous().view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y.contiguous())
                       for x, y in zip(got, ref))
            t = bench_ms(lambda: call(v, kernel, a, b, width, out_width))
            rows.append({"kernel": kernel, "width": width, "launch": name, "ms": t, "GBps": nbytes / t / 1e6,
                         "same_as_library": same})
            print(json.dumps(rows[-1]), flush=True)
    record = {"device": device_info(), "M": m, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "fp8_quant_launch.json").write_text(json.dumps(record, indent=1))
    print("| kernel | width | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for kernel, width, _ in cases:
        mine = [r for r in rows if r["kernel"] == kernel and r["width"] == width]
        print(f"| {kernel} | {width} | " + " | ".join(f"{r['ms']:.3f}{'' if r['same_as_library'] else ' (differs)'}"
                                                  for r in mine) + " |")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--lib", type=Path, default=None, help="a library built with -DPUROKIT_QUANT_VARIANTS")
    ap.add_argument("--build-only", action="store_true", help="build --lib and stop")
    args = ap.parse_args()
    if args.build_only:
        if args.lib is None:
            raise SystemExit("--build-only needs --lib PATH")
        print(build_lib(args.lib))
        return
    run(Path(args.out), args.lib)


if __name__ == "__main__":
    main()
