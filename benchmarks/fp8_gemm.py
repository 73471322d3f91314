"""Blockwise FP8 GEMMs and quantization kernels against BF16 ``torch.matmul`` on the same GPU, same run.

For each Transformer linear of the 0.6B and 1.7B presets (K, N from ``trainer.flops.QWEN3_SHAPES``)
and each micro-batch size M (tokens), it times:

- ``bf16``: ``x @ w.t()`` in BF16 (cuBLAS),
- ``fp8_gemm``: ``F.scaled_mm`` with 1x128 / 128x128 scales on pre-quantized operands (GEMM alone),
- ``fp8_fwd``: the whole FP8 forward (Triton quantization of x and w + GEMM),
- ``bf16_step`` / ``fp8_step``: forward + backward of one linear (Fprop, Dgrad, Wgrad; BF16
  ``F.linear`` autograd against ``fp8_linear`` with the product's quantizers, ``auto``, and with the
  torch ones; float32 master weights under autocast, or BF16 weights with ``--bf16-weights``, as
  torchao's single-linear benchmark in ``../shared/bench/peer_torchtitan`` holds them),
and reports TFLOP/s (2MKN per GEMM, 6MKN per forward+backward) and the FP8/BF16 ratios. It also
times the quantization kernels against a device-to-device copy (bandwidth ceiling).

Run on the GPU:  python benchmarks/fp8_gemm.py --out $OUT
Writes fp8_gemm.json and fp8_gemm.md under --out. ``--quant-sweep`` instead times the three activation
kernels (``quant_act``, ``swiglu_quant``, ``swiglu_bwd_quant``) under each launch setting of
``trainer.fp8.triton_kernels.LAUNCH``, each checked bit-identical, against Inductor's SwiGLU plus the
separate quantizer (fp8_quant_sweep.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.flops import QWEN3_SHAPES  # noqa: E402
from trainer.fp8 import Fp8Recipe, fp8_linear, probe_scaled_mm, quantize_1x128, quantize_128x128  # noqa: E402
from trainer.fp8 import gemm  # noqa: E402
from trainer.fp8 import triton_kernels  # noqa: E402
from trainer.fp8.triton_kernels import quant_act, quant_weight, swiglu_bwd_quant, swiglu_quant, triton_available  # noqa: E402


def bench_ms(fn, reps: int = 5, inner: int = 10, warmup: int = 3, graph: bool = False) -> float:
    """Median over `reps` of the mean time of `inner` back-to-back calls, by CUDA events. With ``graph``
    the `inner` calls are captured once in a CUDA graph and replayed: the GPU's time alone, without the
    host's per-call cost (a kernel shorter than its Python launch path would otherwise time the host;
    in the compiled training loop the host runs ahead of the GPU)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = lambda: [fn() for _ in range(inner)]  # noqa: E731
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run()
        run = g.replay
        run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def device_info() -> dict:
    info = {
        "gpu": torch.cuda.get_device_name(0),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        ).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        info["nvidia_smi"] = f"unavailable: {exc}"
    return info


def linear_cases(ms: list[int]) -> list[dict]:
    cases = []
    for preset in ("0.6b", "1.7b"):
        shapes = QWEN3_SHAPES[preset].linear_shapes()
        unique: dict[tuple[int, int], list[str]] = {}
        for name, kn in shapes.items():
            unique.setdefault(kn, []).append(name)
        for m in ms:
            for (k, n), names in unique.items():
                cases.append({"preset": preset, "layers": "/".join(names), "M": m, "K": k, "N": n})
    return cases


def run_case(c: dict, caps, do_step: bool, bf16_weights: bool = False, graph: bool = False) -> dict:
    """One linear: the GEMMs alone, then fwd+bwd of ``F.linear`` (BF16) and of ``fp8_linear`` with the
    product's quantizers (``auto``) and with the torch ones, on float32 master weights under autocast as the
    trainer holds them, or on BF16 weights (``bf16_weights``: as torchao's single-linear benchmark does).
    ``graph``: the fwd+bwd steps are also timed as CUDA-graph replays (``*_graph_tflops``), the GPU's time
    alone, as in the compiled loop where the host runs ahead."""
    m, k, n = c["M"], c["K"], c["N"]
    dev = "cuda"
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w32 = torch.randn(n, k, device=dev) * k**-0.5
    w = w32.to(torch.bfloat16)
    out = dict(c)
    flop = 2 * m * k * n
    t = bench_ms(lambda: x @ w.t())
    out["bf16_tflops"] = flop / t / 1e9
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w32)
    t = bench_ms(lambda: gemm.scaled_mm_fprop(xq, xs, wq, ws, caps))
    out["fp8_gemm_tflops"] = flop / t / 1e9
    y_ref = gemm.emulated_fprop(xq, xs, wq, ws)
    y = gemm.scaled_mm_fprop(xq, xs, wq, ws, caps)
    out["fp8_gemm_relerr_vs_emulation"] = float((y.float() - y_ref).norm() / y_ref.norm())
    if triton_available():
        def fwd():
            q, s, _, _ = quant_act(x, True, True, False)
            wq_, _, ws_ = quant_weight(w32, True, False)
            return gemm.scaled_mm_fprop(q, s, wq_, ws_, caps)

        t = bench_ms(fwd)
        out["fp8_fwd_tflops"] = flop / t / 1e9
    if do_step:
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        xr = x.detach().requires_grad_()
        wr = (w if bf16_weights else w32).detach().requires_grad_()
        out["weights"] = "bf16" if bf16_weights else "fp32"

        def bf16_step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                yy = F.linear(xr, wr)
            yy.backward(dy)

        def fp8_step(quantizer):
            def f():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    yy = fp8_linear(xr, wr, recipe=Fp8Recipe(backend="cuda-scaled-mm", quantizer=quantizer))
                yy.backward(dy)
            return f

        t = bench_ms(bf16_step, reps=3, inner=5)
        out["bf16_step_tflops"] = 3 * flop / t / 1e9
        for quantizer in (["auto"] if triton_available() else []) + ["torch"]:
            t = bench_ms(fp8_step(quantizer), reps=3, inner=5)
            out[f"fp8_step_{quantizer}_tflops"] = 3 * flop / t / 1e9
        if graph:
            for key, fn in (("bf16_step", bf16_step), ("fp8_step_auto", fp8_step("auto"))):
                try:
                    out[f"{key}_graph_tflops"] = 3 * flop / bench_ms(fn, reps=3, inner=5, graph=True) / 1e9
                except Exception as e:  # noqa: BLE001 -- a capture failure is reported, not fatal
                    out[f"{key}_graph_error"] = f"{type(e).__name__}: {e}"[:300]
            if "fp8_step_auto_graph_tflops" in out and "bf16_step_graph_tflops" in out:
                out["speedup_step_graph"] = out["fp8_step_auto_graph_tflops"] / out["bf16_step_graph_tflops"]
        xr.grad = None
        wr.grad = None
    out["speedup_gemm"] = out["fp8_gemm_tflops"] / out["bf16_tflops"]
    if "fp8_step_auto_tflops" in out:
        out["speedup_step"] = out["fp8_step_auto_tflops"] / out["bf16_step_tflops"]
    return out


def quant_bandwidth() -> list[dict]:
    rows = []
    for m, k in [(16384, 2048), (32768, 2048), (32768, 6144)]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_copy = bench_ms(lambda: x.clone())
        copy_gbs = 2 * x.numel() * 2 / t_copy / 1e6
        r = {"M": m, "K": k, "copy_GBps": copy_gbs}
        # bytes: read 2 B/elem, write 1 B row + 1 B transposed copy, scales 2 x 4 B / 128
        nbytes = x.numel() * (2 + 1 + 1 + 8 / 128)
        if triton_available():
            t = bench_ms(lambda: quant_act(x, True, True, True))
            r["triton_dual_ms"] = t
            r["triton_dual_GBps"] = nbytes / t / 1e6
            t = bench_ms(lambda: quant_act(x, True, True, False))
            r["triton_row_ms"] = t
        t = bench_ms(lambda: (quantize_1x128(x), quantize_1x128(x.t())))
        r["torch_eager_dual_ms"] = t
        compiled = torch.compile(lambda a: (quantize_1x128(a), quantize_1x128(a.t())))
        compiled(x)
        t = bench_ms(lambda: compiled(x))
        r["torch_compiled_dual_ms"] = t
        r["torch_compiled_dual_GBps"] = nbytes / t / 1e6
        rows.append(r)
    return rows


LAUNCHES = [(8, 4), (16, 4), (16, 8), (32, 8), (64, 8), (128, 8)]


def _launch_with(kernel: str, launch: tuple[int, int], fn):
    """Run ``fn`` with one kernel's launch settings (rows or columns a band, warps) set to ``launch``."""
    saved = dict(triton_kernels.LAUNCH)
    triton_kernels.LAUNCH[kernel] = launch
    try:
        return fn()
    finally:
        triton_kernels.LAUNCH.clear()
        triton_kernels.LAUNCH.update(saved)


def _same(a, b) -> bool:
    return all(torch.equal(x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x,
                           y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y) for x, y in zip(a, b))


def _sweep(kernel: str, fn, nbytes: float, **labels) -> list[dict]:
    """Time ``fn`` under each launch setting of ``kernel``; check each result bit-identical to the first."""
    rows, ref = [], None
    for launch in LAUNCHES:
        got = _launch_with(kernel, launch, fn)
        ref = got if ref is None else ref
        t = _launch_with(kernel, launch, lambda: bench_ms(fn))
        rows.append({"kernel": kernel, **labels, "part": launch[0], "warps": launch[1], "ms": t,
                     "GBps": nbytes / t / 1e6, "bit_identical": _same(got, ref)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def quant_sweep(m: int = 32768) -> dict:
    """The three activation kernels' launch settings (band of rows/columns, warps), each checked
    bit-identical to the first; and the fused SwiGLU quantizers against Inductor's SwiGLU (forward,
    backward) followed by the activation quantizer. GB/s count each kernel's own DRAM traffic."""
    rows = []
    for k in (2048, 4096, 6144, 12288):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        rows += _sweep("act", lambda: quant_act(x, True, True, True), x.numel() * (2 + 2 + 8 / 128), M=m, K=k)
    f = 6144
    gu = torch.randn(m, 2 * f, device="cuda", dtype=torch.bfloat16)
    dh = torch.randn(m, f, device="cuda", dtype=torch.bfloat16)
    rows += _sweep("swiglu", lambda: swiglu_quant(gu, True, True), m * f * (4 + 2 + 8 / 128), M=m, F=f)
    rows += _sweep("swiglu_bwd", lambda: swiglu_bwd_quant(gu, dh, True, True, True), m * f * (6 + 4 + 16 / 128),
                   M=m, F=f)

    def unfused_fwd(a):
        g, u = a.float().chunk(2, dim=-1)
        return (F.silu(g) * u).to(a.dtype)

    def unfused_bwd(a, d):
        g, u = a.float().chunk(2, dim=-1)
        d = d.float()
        return torch.cat([torch.ops.aten.silu_backward(d * u, g), d * F.silu(g)], dim=-1).to(a.dtype)

    fwd_c, bwd_c = torch.compile(unfused_fwd), torch.compile(unfused_bwd)
    unfused = {"swiglu (Inductor) + act": bench_ms(lambda: quant_act(fwd_c(gu), True, True, True)),
               "swiglu_bwd (Inductor) + act": bench_ms(lambda: quant_act(bwd_c(gu, dh), True, True, True))}
    print(json.dumps(unfused), flush=True)
    return {"launch": rows, "unfused_ms": unfused}


def _differing(a, b) -> float:
    """Fraction of elements (codes or scales) that differ between two quantizer outputs."""
    n = d = 0
    for x, y in zip(a, b):
        x = x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x
        y = y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y
        n += x.numel()
        d += int((x != y).sum())
    return d / max(n, 1)


def quant_impls(m: int = 32768) -> list[dict]:
    """The three activation ops on Triton's kernels and on the CUDA kernels (csrc/quantize.cu), at the
    1.7B shapes: ms of GPU time (CUDA-graph replays), GB/s of each kernel's own DRAM traffic, and the fraction of outputs that differ
    (0 for quant_act, which is bit-exact; the SwiGLU kernels differ in the fast sigmoid's last bits)."""
    rows = []

    def both(name, fn, nbytes, **labels):
        got = {impl: fn(impl) for impl in ("triton", "cuda")}
        r = {"kernel": name, **labels, "differing": _differing(got["triton"], got["cuda"])}
        for impl in ("triton", "cuda"):
            t = bench_ms(lambda: fn(impl), graph=True)  # GPU time: at K = 2048 the op's host path is longer
            r[f"{impl}_ms"], r[f"{impl}_GBps"] = t, nbytes / t / 1e6
        r["speedup"] = r["triton_ms"] / r["cuda_ms"]
        rows.append(r)
        print(json.dumps(r), flush=True)

    for k in (2048, 4096, 6144):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        both("act", lambda impl: quant_act(x, True, True, True, impl=impl), x.numel() * (2 + 2 + 8 / 128), M=m, K=k)
    f = 6144
    gu = torch.randn(m, 2 * f, device="cuda", dtype=torch.bfloat16)
    dh = torch.randn(m, f, device="cuda", dtype=torch.bfloat16)
    both("swiglu", lambda impl: swiglu_quant(gu, True, True, impl=impl), m * f * (4 + 2 + 8 / 128), M=m, F=f)
    both("swiglu_bwd", lambda impl: swiglu_bwd_quant(gu, dh, True, True, True, impl=impl),
         m * f * (6 + 4 + 16 / 128), M=m, F=f)
    return rows


def _row(r: dict, columns: list[tuple[str, str]]) -> str:
    """One markdown table row: each (key, format) cell of `r`, '–' where the key is missing."""
    return "| " + " | ".join(fmt.format(r[key]) if key in r else "–" for key, fmt in columns) + " |"


CASE_COLUMNS = [("preset", "{}"), ("layers", "{}"), ("M", "{}"), ("K", "{}"), ("N", "{}"), ("bf16_tflops", "{:.0f}"),
                ("fp8_gemm_tflops", "{:.0f}"), ("fp8_fwd_tflops", "{:.0f}"), ("speedup_gemm", "{:.2f}"),
                ("bf16_step_tflops", "{:.0f}"), ("fp8_step_auto_tflops", "{:.0f}"), ("fp8_step_torch_tflops", "{:.0f}"),
                ("speedup_step", "{:.2f}"), ("bf16_step_graph_tflops", "{:.0f}"),
                ("fp8_step_auto_graph_tflops", "{:.0f}"), ("speedup_step_graph", "{:.2f}")]
QUANT_COLUMNS = [("M", "{}"), ("K", "{}"), ("copy_GBps", "{:.0f}"), ("triton_dual_ms", "{:.3f}"),
                 ("triton_dual_GBps", "{:.0f}"), ("triton_row_ms", "{:.3f}"), ("torch_eager_dual_ms", "{:.3f}"),
                 ("torch_compiled_dual_ms", "{:.3f}"), ("torch_compiled_dual_GBps", "{:.0f}")]


def markdown(info: dict, cases: list[dict], quant: list[dict]) -> str:
    lines = [
        f"GPU {info['gpu']} (sm{info['capability']}), torch {info['torch']}, CUDA {info['cuda']}, "
        f"triton {info['triton']}, {info['date_utc']} UTC. TFLOP/s; medians of CUDA-event timings.",
        "",
        "| preset | linear(s) | M | K | N | BF16 | FP8 GEMM | FP8 fwd (quant+GEMM) | x BF16 (GEMM) | BF16 fwd+bwd | FP8 fwd+bwd (auto q) | FP8 fwd+bwd (torch q) | x BF16 (fwd+bwd) | BF16 fwd+bwd (graph) | FP8 fwd+bwd (graph) | x BF16 (graph) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(c, CASE_COLUMNS) for c in cases]
    lines += ["", "Quantization (x: M x K BF16 -> row copy + transposed copy, pow2 scales):", "",
              "| M | K | copy GB/s | Triton dual ms | Triton dual GB/s | Triton row-only ms | torch eager ms | torch compiled ms | torch compiled GB/s |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [_row(r, QUANT_COLUMNS) for r in quant]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--m", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--no-step", action="store_true", help="skip the forward+backward timings")
    ap.add_argument("--bf16-weights", action="store_true",
                    help="fwd+bwd on BF16 weights (as torchao's single-linear benchmark) instead of float32 masters")
    ap.add_argument("--shapes", nargs="+", metavar="KxN",
                    help="only these single linears (in-features x out-features) at each --m, e.g. issue 16's "
                    "2048x2048 2048x6144 6144x2048, instead of every linear of the presets")
    ap.add_argument("--graph", action="store_true",
                    help="also time each fwd+bwd as CUDA-graph replays (the GPU's time alone)")
    ap.add_argument("--quant-impls", action="store_true",
                    help="only the activation quantizers, Triton against CUDA (fp8_quant_impls.json)")
    ap.add_argument("--quant-sweep", action="store_true",
                    help="only the quantizers' launch settings and the fused SwiGLU quantizers (fp8_quant_sweep.json)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.quant_impls:
        result = {"device": device_info(), "impls": quant_impls()}
        (out / "fp8_quant_impls.json").write_text(json.dumps(result, indent=1))
        return
    if args.quant_sweep:
        result = {"device": device_info(), **quant_sweep()}
        (out / "fp8_quant_sweep.json").write_text(json.dumps(result, indent=1))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    info = device_info()
    caps = probe_scaled_mm("cuda")
    info["scaled_mm_caps"] = str(caps)
    print(json.dumps(info), flush=True)
    if not caps.blockwise:
        raise SystemExit(f"blockwise F.scaled_mm unavailable: {caps.reason}")
    cases = []
    if args.shapes:
        todo = [{"preset": "single", "layers": "-", "M": m, "K": int(k), "N": int(n)}
                for m in args.m for k, n in (s.lower().split("x") for s in args.shapes)]
    else:
        todo = [{"preset": "square", "layers": "-", "M": 8192, "K": 8192, "N": 8192}] + linear_cases(args.m)
    for c in todo:
        r = run_case(c, caps, do_step=not args.no_step, bf16_weights=args.bf16_weights, graph=args.graph)
        cases.append(r)
        print(json.dumps(r), flush=True)
    quant = [] if args.shapes else quant_bandwidth()
    for r in quant:
        print(json.dumps(r), flush=True)
    (out / "fp8_gemm.json").write_text(json.dumps({"device": info, "cases": cases, "quant": quant}, indent=1))
    md = markdown(info, cases, quant)
    (out / "fp8_gemm.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
