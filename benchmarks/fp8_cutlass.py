"""The library's blockwise-FP8 GEMMs (``trainer.fp8.cutlass_gemm``: CUTLASS's and DeepGEMM's kernels) against
cuBLAS's (``F.scaled_mm``), same GPU, same run.

For the block linears of the 1.7B preset at M = 32,768 tokens — (K, N) = (2048, 4096) stacked qkv,
(2048, 2048) o, (2048, 12288) stacked gate-up, (6144, 2048) down, and (2048, 6144) gate alone — it
times Fprop (x w^T), Dgrad (dy w) and Wgrad (dy^T x, fp32 out) on the same pre-quantized operands:
cuBLAS through ``gemm.scaled_mm_fprop/dgrad/wgrad`` and every config of the library that runs the
shape (CUTLASS's, and DeepGEMM's where the library was built with it), each at the default tile
order, then the two fastest CUTLASS configs of each GEMM over rasterization x swizzle (DeepGEMM's
order their own tiles). It also times Wgrad accumulating into an fp32 gradient (the library's
``out=`` against cuBLAS + ``add_``). Each result is checked against cuBLAS's (relative error of the
norm). TFLOP/s = 2MNK / median CUDA-event time.

Run on the GPU:  python benchmarks/fp8_cutlass.py --out $OUT [--write-table]   (needs .gpu_build/libpurokit_fp8_gemm.so)
Writes fp8_cutlass.json and fp8_cutlass.md under --out; ``run(out)`` does the same from Python. With
``--write-table`` also ``$OUT/gemm_table.json``: per shape, CUTLASS where its best config is >= 1.02x
cuBLAS and agrees with it (relative error < 1e-2), else cuBLAS — the table ``trainer.fp8.gemm`` reads
(``trainer/fp8/gemm_table.json``); rows of other devices already in the file are kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fp8_gemm import bench_ms, device_info  # noqa: E402
from trainer.fp8 import cutlass_gemm as cg  # noqa: E402
from trainer.fp8 import gemm, probe_scaled_mm, quantize_1x128, quantize_128x128  # noqa: E402

LINEARS = [("qkv", 2048, 4096), ("o", 2048, 2048), ("gate_up", 2048, 12288), ("down", 6144, 2048),
           # gate (or up) alone: not a loop shape (the loop stacks them), but the single-linear shape issue 16
           # measures; its Fprop and Dgrad are down's Dgrad and Fprop, its Wgrad is its own
           ("gate", 2048, 6144)]
SCHEDULES = [(r, s) for r in ("heuristic", "m", "n") for s in (1, 2, 4, 8)]


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def operands(m: int, k: int, n: int, seed: int = 0) -> dict:
    """Quantized x (M, K), w (N, K), dy (M, N) and the token-major copies Wgrad reads."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g) * k**-0.5
    dy = (torch.randn(m, n, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w)
    dyq, dys = quantize_1x128(dy)
    dytq, dyts = quantize_1x128(dy.t())
    xtq, xts = quantize_1x128(x.t())
    return dict(xq=xq, xs=xs, wq=wq, ws=ws, wtq=wq.t().contiguous(), dyq=dyq, dys=dys,
                dytq=dytq, dyts=dyts, xtq=xtq, xts=xts)


def problems(o: dict, caps) -> list[dict]:
    """The three GEMMs of one linear: CUTLASS kind, its (M, N, K), the cuBLAS call and ours."""
    m, k = o["xq"].shape
    n = o["wq"].shape[0]
    return [
        dict(gemm="fprop", kind="act_weight", mnk=(m, n, k),
             cublas=lambda: gemm.scaled_mm_fprop(o["xq"], o["xs"], o["wq"], o["ws"], caps),
             ours=lambda cfg, r, s: cg.fprop(o["xq"], o["xs"], o["wq"], o["ws"], cfg, raster=r, swizzle=s)),
        dict(gemm="dgrad", kind="act_weight", mnk=(m, k, n),
             cublas=lambda: gemm.scaled_mm_dgrad(o["dyq"], o["dys"], o["wtq"], o["ws"], caps),
             ours=lambda cfg, r, s: cg.dgrad(o["dyq"], o["dys"], o["wtq"], o["ws"], cfg, raster=r, swizzle=s)),
        dict(gemm="wgrad", kind="act_act", mnk=(n, k, m),
             cublas=lambda: gemm.scaled_mm_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], caps),
             ours=lambda cfg, r, s: cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], cfg, raster=r, swizzle=s)),
    ]


def _time(fn, flop: float, reference: torch.Tensor | None) -> dict:
    try:
        result = fn()
        ms = bench_ms(fn)
    except Exception as exc:  # noqa: BLE001  (a config the problem does not suit is a row, not a crash)
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    row = {"ms": ms, "tflops": flop / ms / 1e9}
    if reference is not None:
        row["relerr_vs_cublas"] = _relerr(result, reference)
    return row


def bench_problem(layer: str, p: dict, sweep: bool) -> list[dict]:
    m, n, k = p["mnk"]
    flop = 2.0 * m * n * k
    base = {"layer": layer, "gemm": p["gemm"], "kind": p["kind"], "M": m, "N": n, "K": k}
    reference = p["cublas"]()
    rows = [dict(base, impl="cublas", config="-", raster="-", swizzle="-", **_time(p["cublas"], flop, None))]
    for cfg in cg.configs(p["kind"], n, k):  # DeepGEMM's act_weight configs: only the one compiled for (N, K)
        rows.append(dict(base, impl="cutlass", config=cfg, raster="heuristic", swizzle=1,
                         **_time(lambda: p["ours"](cfg, "heuristic", 1), flop, reference)))
    if sweep:
        ranked = sorted((r for r in rows if r["impl"] == "cutlass" and "ms" in r and cg.takes_schedule(r["config"])),
                        key=lambda r: r["ms"])[:2]
        for best in ranked:
            for raster, swizzle in SCHEDULES:
                if (raster, swizzle) == ("heuristic", 1):
                    continue
                cfg = best["config"]
                rows.append(dict(base, impl="cutlass", config=cfg, raster=raster, swizzle=swizzle,
                                 **_time(lambda: p["ours"](cfg, raster, swizzle), flop, reference)))
    return rows


def bench_accumulate(layer: str, o: dict, caps, config: str, raster: str, swizzle: int) -> dict:
    """Wgrad into an fp32 gradient buffer: the library's in-place ``out +=`` against cuBLAS then ``add_``."""
    n, m = o["dytq"].shape
    k = o["xtq"].shape[0]
    flop = 2.0 * m * n * k
    grad = torch.zeros(n, k, device="cuda")

    def cublas():
        grad.add_(gemm.scaled_mm_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], caps))

    def ours():
        cg.wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], config, out=grad, raster=raster, swizzle=swizzle)

    t_cublas, t_ours = bench_ms(cublas), bench_ms(ours)
    grad.zero_()
    ours()
    ours()
    err = _relerr(grad, 2 * gemm.scaled_mm_wgrad(o["dytq"], o["dyts"], o["xtq"], o["xts"], caps))
    return {"layer": layer, "M": n, "N": k, "K": m, "config": config, "raster": raster, "swizzle": swizzle,
            "cublas_plus_add_tflops": flop / t_cublas / 1e9, "cutlass_accumulate_tflops": flop / t_ours / 1e9,
            "relerr_twice_vs_cublas": err}


def best_rows(rows: list[dict]) -> list[dict]:
    """Per (layer, GEMM): cuBLAS and the fastest CUTLASS row, with the ratio."""
    out = []
    keys = list(dict.fromkeys((r["layer"], r["gemm"]) for r in rows))
    for layer, g in keys:
        mine = [r for r in rows if (r["layer"], r["gemm"]) == (layer, g) and "ms" in r]
        cub = next((r for r in mine if r["impl"] == "cublas"), None)
        ours = min((r for r in mine if r["impl"] == "cutlass"), key=lambda r: r["ms"], default=None)
        if cub is None or ours is None:
            continue
        out.append({"layer": layer, "gemm": g, "M": cub["M"], "N": cub["N"], "K": cub["K"],
                    "cublas_tflops": cub["tflops"], "cutlass_tflops": ours["tflops"],
                    "speedup": cub["ms"] / ours["ms"], "config": ours["config"], "raster": ours["raster"],
                    "swizzle": ours["swizzle"], "relerr_vs_cublas": ours.get("relerr_vs_cublas")})
    return out


TABLE_MARGIN = 1.02  # CUTLASS only where its best config beats cuBLAS by this much at that shape
TABLE_MAX_RELERR = 1e-2


def gemm_table(record: dict, margin: float = TABLE_MARGIN, max_relerr: float = TABLE_MAX_RELERR) -> dict:
    """The per-shape library choice ``trainer/fp8/gemm_table.json`` holds (read by
    ``gemm.table_entry``), for this record's device: role -> "MxNxK" -> cuBLAS, or the CUTLASS config
    (with its rasterization and swizzle) where it is ``margin`` x faster and agrees with cuBLAS."""
    roles: dict[str, dict] = {}
    for b in record["best"]:
        relerr = b.get("relerr_vs_cublas")
        if b["speedup"] >= margin and relerr is not None and relerr < max_relerr:
            choice = {"library": "cutlass", "config": b["config"], "raster": b["raster"], "swizzle": int(b["swizzle"])}
        else:
            choice = {"library": "cublas"}
        roles.setdefault(b["gemm"], {})[f"{b['M']}x{b['N']}x{b['K']}"] = choice
    return {
        "measured": record["device"]["date_utc"],
        "command": "python3 benchmarks/fp8_cutlass.py --out $OUT --write-table",
        "rule": f"our library (a CUTLASS or DeepGEMM config) where its best config is >= {margin}x cuBLAS at that shape",
        "devices": {record["device"]["gpu"]: roles},
    }


def write_table(record: dict, path: Path, merge: bool = False) -> dict:
    """Write (or update: other devices' rows are kept) the GEMM table at ``path``; return it. ``merge``
    (a run over some of the linears): this device's rows for the shapes not measured are kept too, and the
    run is listed under "updates" beside the full measurement's date and command."""
    table = gemm_table(record)
    if path.exists():
        old = json.loads(path.read_text())
        devices = old.get("devices", {})
        if merge:
            gpu, roles = next(iter(table["devices"].items()))
            kept = devices.get(gpu, {})
            merged = {role: {**kept.get(role, {}), **roles.get(role, {})} for role in [*kept, *(r for r in roles if r not in kept)]}
            update = {"measured": table["measured"], "command": record.get("command", table["command"])}
            table = {**old, "updates": old.get("updates", []) + [update], "devices": {**devices, gpu: merged}}
        else:
            table["devices"] = {**devices, **table["devices"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(path)
    return table


def markdown(info: dict, best: list[dict], rows: list[dict], accumulate: list[dict]) -> str:
    lines = [
        f"GPU {info['gpu']} (sm{info['capability']}), torch {info['torch']}, CUDA {info['cuda']}, "
        f"{info['date_utc']} UTC; library {info['library']}. TFLOP/s = 2MNK / median CUDA-event time.",
        "",
        "| linear | GEMM | M | N | K | cuBLAS | CUTLASS best | x cuBLAS | config | raster | swizzle | rel. err vs cuBLAS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in best:
        lines.append(f"| {b['layer']} | {b['gemm']} | {b['M']} | {b['N']} | {b['K']} | {b['cublas_tflops']:.0f} | "
                     f"**{b['cutlass_tflops']:.0f}** | {b['speedup']:.2f} | {b['config']} | {b['raster']} | "
                     f"{b['swizzle']} | {b['relerr_vs_cublas']:.1e} |")
    lines += ["", "Wgrad into an fp32 gradient (TFLOP/s): cuBLAS + `add_` vs the library's in-place accumulate", "",
              "| linear | M | N | K | config | cuBLAS + add | CUTLASS accumulate | rel. err (twice) |",
              "|---|---|---|---|---|---|---|---|"]
    for a in accumulate:
        lines.append(f"| {a['layer']} | {a['M']} | {a['N']} | {a['K']} | {a['config']} | "
                     f"{a['cublas_plus_add_tflops']:.0f} | {a['cutlass_accumulate_tflops']:.0f} | "
                     f"{a['relerr_twice_vs_cublas']:.1e} |")
    lines += ["", "Every timing:", "", "| linear | GEMM | impl | config | raster | swizzle | TFLOP/s | rel. err |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        perf = f"{r['tflops']:.0f}" if "tflops" in r else r.get("error", "?")
        err = f"{r['relerr_vs_cublas']:.1e}" if "relerr_vs_cublas" in r else "–"
        lines.append(f"| {r['layer']} | {r['gemm']} | {r['impl']} | {r['config']} | {r['raster']} | {r['swizzle']} | "
                     f"{perf} | {err} |")
    return "\n".join(lines) + "\n"


def run(out: Path | str, m: int = 32768, sweep: bool = True, linears=LINEARS) -> dict:
    """Time everything, write ``fp8_cutlass.json`` and ``fp8_cutlass.md`` under ``out``, return the record."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ok, reason = cg.available()
    if not ok:
        raise RuntimeError(f"CUTLASS fp8 GEMMs unavailable: {reason}")
    caps = probe_scaled_mm("cuda")
    if not caps.blockwise:
        raise RuntimeError(f"blockwise F.scaled_mm unavailable: {caps.reason}")
    info = dict(device_info(), library=reason, scaled_mm_caps=str(caps))
    t0 = time.monotonic()
    rows, accumulate = [], []
    for layer, k, n in linears:
        o = operands(m, k, n)
        for p in problems(o, caps):
            rows += bench_problem(layer, p, sweep)
            print(json.dumps(best_rows(rows)[-1]), flush=True)
        wg = [b for b in best_rows(rows) if (b["layer"], b["gemm"]) == (layer, "wgrad")]
        if wg:
            accumulate.append(bench_accumulate(layer, o, caps, wg[0]["config"], wg[0]["raster"], wg[0]["swizzle"]))
        del o
        torch.cuda.empty_cache()
    best = best_rows(rows)
    record = {"device": info, "M": m, "seconds": time.monotonic() - t0, "best": best, "accumulate": accumulate,
              "rows": rows}
    (out / "fp8_cutlass.json").write_text(json.dumps(record, indent=1))
    md = markdown(info, best, rows, accumulate)
    (out / "fp8_cutlass.md").write_text(md)
    print(md, flush=True)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--m", type=int, default=32768, help="tokens (M of Fprop/Dgrad, K of Wgrad)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the rasterization x swizzle sweep")
    ap.add_argument("--linears", nargs="+", choices=[name for name, _, _ in LINEARS],
                    help="only these linears; --write-table then merges their rows into the table at PATH")
    ap.add_argument("--write-table", nargs="?", const="", metavar="PATH",
                    help="also write the per-shape GEMM table trainer.fp8.gemm reads (PATH default: "
                    f"OUT/gemm_table.json; it belongs at {gemm.GEMM_TABLE.relative_to(REPO)})")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    linears = [lin for lin in LINEARS if lin[0] in args.linears] if args.linears else LINEARS
    record = run(args.out, args.m, sweep=not args.no_sweep, linears=linears)
    record["command"] = "python3 benchmarks/fp8_cutlass.py " + " ".join(sys.argv[1:])
    if args.write_table is not None:
        path = Path(args.write_table) if args.write_table else Path(args.out) / "gemm_table.json"
        print(json.dumps(write_table(record, path, merge=bool(args.linears)), indent=1))


if __name__ == "__main__":
    main()
