"""MuonH's Newton-Schulz in its two forms (trainer.optim.newton_schulz, ``form="standard"`` / ``"gram"``) on the
CPU: time per call and GEMM FLOPs per matrix shape, the ratio gram / standard from the same run. The CPU says
how the FLOP counts play out on one machine; which form is faster on the GPU (bf16 standard against fp16 gram,
tensor cores) is for a GPU run to measure.

    .venv/bin/python benchmarks/newton_schulz_cpu.py --out benchmarks/results/newton_schulz_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# (rows, cols) of the 150m preset's matrices that are not square (q and o are: both forms run the same code)
SHAPES_150M = [(512, 1024), (3072, 1024), (1024, 3072)]
# one block of the 1.7B preset: q, k, v, o, gate, up, down (28 blocks)
BLOCK_17B, LAYERS_17B = [(2048, 2048), (1024, 2048), (1024, 2048), (2048, 2048), (6144, 2048), (6144, 2048),
                         (2048, 6144)], 28


def ns_flops(m: int, n: int, steps: int = 5, form: str = "standard", restarts: tuple[int, ...] = (2,)) -> int:
    """GEMM FLOPs of one Newton-Schulz call on an (m, n) matrix (2 per multiply-add), in its wide orientation."""
    m, n = min(m, n), max(m, n)
    if form == "standard" or m == n:
        return steps * (2 * m * m * n + 2 * m ** 3 + 2 * m * m * n)
    total = 2 * m * m * n                                   # R = X X^T
    for i in range(steps):
        if i and i in restarts:
            total += 2 * m * m * n * 2                      # X <- Q X, R = X X^T
        total += 2 * m ** 3                                 # R^2 (in Z)
        if i and i not in restarts:
            total += 2 * m ** 3                             # Q Z
        if i + 1 < steps and i + 1 not in restarts:
            total += 2 * 2 * m ** 3                         # R P, P R P
    return total + 2 * m * m * n                            # Q X


def time_call(fn, repeats: int) -> float:
    fn()                                                    # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    from trainer.optim import newton_schulz

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON of the rows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=2, help="matrices of each shape in one call (a bucket)")
    args = p.parse_args(argv)
    rows = []
    for m, n in SHAPES_150M:
        G = torch.randn(args.batch, m, n, generator=torch.Generator().manual_seed(0))
        secs = {form: time_call(lambda f=form: newton_schulz(G, dtype=torch.float32, form=f), args.repeats)
                for form in ("standard", "gram")}
        flops = {form: ns_flops(m, n, form=form) for form in secs}
        rows.append({"shape": [m, n], "batch": args.batch, "standard_s": secs["standard"], "gram_s": secs["gram"],
                     "time_ratio_gram_over_standard": secs["gram"] / secs["standard"],
                     "flop_ratio_gram_over_standard": flops["gram"] / flops["standard"]})
        print(f"{m}x{n} x{args.batch}: standard {secs['standard']:.3f} s, gram {secs['gram']:.3f} s "
              f"(time {rows[-1]['time_ratio_gram_over_standard']:.2f}x, FLOPs "
              f"{rows[-1]['flop_ratio_gram_over_standard']:.2f}x)", flush=True)
    step = {form: LAYERS_17B * sum(ns_flops(m, n, form=form) for m, n in BLOCK_17B) for form in ("standard", "gram")}
    print(f"1.7B, one optimizer step: {step['standard'] / 1e12:.1f} TFLOP standard, {step['gram'] / 1e12:.1f} gram "
          f"({step['gram'] / step['standard']:.2f}x)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": "cpu", "dtype": "float32", "torch_threads": torch.get_num_threads(),
                                    "rows": rows, "flops_per_step_1.7b": step}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
