"""Check that torch.compile traces a converted trainer model in one graph (no graph breaks at the FP8
linears), and print Dynamo's break reasons if it does not.

Run on the GPU:  python benchmarks/fp8_compile_check.py [--quantizer torch|triton|auto]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.fp8 import Fp8Recipe, convert_to_fp8  # noqa: E402
from trainer.model import build_model, preset_config, token_losses  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quantizer", default="auto", choices=["auto", "triton", "torch"])
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    cfg = preset_config("150m", vocab_size=4096, n_layers=args.layers)
    model = build_model(cfg, seed=0, device="cuda")
    convert_to_fp8(model, Fp8Recipe(quantizer=args.quantizer))
    ids = torch.randint(0, 4096, (2, 1025), device="cuda")

    def step(inputs, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs)
        loss = token_losses(logits, targets).mean()
        return loss

    explanation = torch._dynamo.explain(step)(ids[:, :-1], ids[:, 1:])
    print(f"quantizer={args.quantizer}: graphs {explanation.graph_count}, breaks {explanation.graph_break_count}")
    for reason in explanation.break_reasons[:10]:
        print("  break:", str(reason.reason)[:400])
        for frame in reason.user_stack[-3:]:
            print("     at", frame)
    compiled = torch.compile(step)
    loss = compiled(ids[:, :-1], ids[:, 1:])
    loss.backward()
    print(f"compiled step ok, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
