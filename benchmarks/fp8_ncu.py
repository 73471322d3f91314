"""One GEMM of the 1.7B preset (gate/up: M=32768 tokens, K=2048, N=6144) for Nsight Compute:
BF16 `x @ w.t()` or the blockwise FP8 `F.scaled_mm` on pre-quantized operands, a few launches.

    ncu --profile-from-start off --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python benchmarks/fp8_ncu.py fp8        # or bf16

Only the timed loop is profiled (cudaProfilerStart/Stop around it), not the quantization or the
backend probe that runs before.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.fp8 import gemm, probe_scaled_mm, quantize_1x128, quantize_128x128  # noqa: E402


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "fp8"
    m, k, n = (int(a) for a in sys.argv[2:5]) if len(sys.argv) > 4 else (32768, 2048, 6144)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w32 = torch.randn(n, k, device="cuda") * k**-0.5
    if mode == "bf16":
        w = w32.to(torch.bfloat16)

        def run():
            return x @ w.t()
    else:
        caps = probe_scaled_mm("cuda")
        xq, xs = quantize_1x128(x)
        wq, ws = quantize_128x128(w32)

        def run():
            return gemm.scaled_mm_fprop(xq, xs, wq, ws, caps)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
