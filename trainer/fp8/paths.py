"""Which path each blockwise-FP8 GEMM of a model takes, and why: said once when a run starts.

A linear's three GEMMs (Fprop, Dgrad, Wgrad) run on the emulation (dequantize, float32 matmul), on cuBLAS
(``F.scaled_mm``) or on our Hopper library (``trainer/fp8/csrc``: CUTLASS's and DeepGEMM's kernels), per
shape, as :func:`trainer.fp8.linear._resolve` (backend) and :func:`trainer.fp8.gemm.choose_gemm` (library)
decide at run time. :func:`gemm_paths` asks the same questions up front for the shapes a model will run
(its weight stacks at the micro-batch's token count), so a user sees at start whether the fast path is
there, and what to install or build where it is not, instead of a slower run with no word about it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from trainer.fp8 import gemm
from trainer.fp8.convert import resolve_recipe
from trainer.fp8.linear import Fp8Linear
from trainer.fp8.recipe import GROUP


@dataclasses.dataclass(frozen=True)
class GemmPath:
    linears: str      # the weight stack's linears ("q_proj+k_proj+v_proj")
    role: str         # fprop, dgrad, wgrad
    mnk: tuple[int, int, int]
    path: str         # "emulation", "cuBLAS", or "library <config>"
    why: str


def gemm_shapes(model: nn.Module) -> list[tuple[str, int, int]]:
    """(linears, N, K) of each distinct FP8 weight a block GEMM of ``model`` (a ``trainer.model.Transformer``)
    computes with: a stack of FP8 siblings as one stacked weight (as ``trainer.fp8.modules.stacked_linears`` runs
    them), an FP8 linear of a mixed stack alone; named by the first block's linears."""
    from trainer.fp8.modules import weight_stacks

    names = {id(m): name.rsplit(".", 1)[-1] for name, m in model.named_modules()}
    seen: dict[tuple[int, int], str] = {}
    for stack in weight_stacks(model):
        fp8 = [m for m in stack if isinstance(m, Fp8Linear)]
        groups = [tuple(fp8)] if fp8 and len(fp8) == len(stack) else [(m,) for m in fp8]
        for group in groups:
            n, k = sum(m.out_features for m in group), group[0].in_features
            seen.setdefault((n, k), "+".join(names[id(m)] for m in group))
    return [(name, n, k) for (n, k), name in seen.items()]


def emulation_reason(backend: str, is_cuda: bool, n: int, k: int, caps: gemm.ScaledMmCaps | None) -> str | None:
    """Why a linear of weight (N, K) runs on the emulation, or None where the CUDA backend takes it (the rule
    of ``linear._resolve``)."""
    if backend == "emulate":
        return "the recipe's backend is emulate"
    if not is_cuda:
        return "no CUDA device"
    if n % GROUP or k % GROUP:
        return f"in/out features not multiples of {GROUP}"
    if caps is None or not caps.blockwise:
        return f"F.scaled_mm blockwise is unusable here ({caps.reason if caps else 'not probed'})"
    return None


def kernel_shapes(tokens: int, n: int, k: int) -> dict[str, tuple[int, int, int]]:
    """The (M, N, K) each GEMM of a linear of weight (N, K) hands the kernels at ``tokens`` tokens: Dgrad
    multiplies by the weight's transpose, Wgrad reduces over the tokens (padded to 128)."""
    padded = -(-tokens // GROUP) * GROUP
    return {"fprop": (tokens, n, k), "dgrad": (tokens, k, n), "wgrad": (n, k, padded)}


def gemm_paths(model: nn.Module, recipe: object, tokens: int, device: torch.device) -> list[GemmPath]:
    """The path, and why, of every GEMM of the model's FP8 weights at ``tokens`` tokens a micro-batch."""
    r = resolve_recipe(recipe)
    caps = gemm.probe_scaled_mm(device) if device.type == "cuda" and r.backend != "emulate" else None
    rows = []
    for name, n, k in gemm_shapes(model):
        why = emulation_reason(r.backend, device.type == "cuda", n, k, caps)
        for role, (m, n_, k_) in kernel_shapes(tokens, n, k).items():
            if why is not None:
                rows.append(GemmPath(name, role, (m, n_, k_), "emulation", why))
                continue
            choice, reason = gemm.decide_gemm(role, m, n_, k_, r.gemm, device)
            path = f"library {choice.config}" if choice.library == "cutlass" else "cuBLAS"
            rows.append(GemmPath(name, role, (m, n_, k_), path, reason))
    return rows


def describe(rows: list[GemmPath], tokens: int) -> str:
    """One line where every GEMM takes one path for one reason, else a line a GEMM."""
    if not rows:
        return "[fp8] no FP8 GEMMs"
    head = f"[fp8] GEMM paths at {tokens:,} tokens a micro-batch"
    if len({(r.path, r.why) for r in rows}) == 1:
        return f"{head}: all {len(rows)} ({len(rows) // 3} weight shapes x fprop/dgrad/wgrad) on {rows[0].path}: " \
               f"{rows[0].why}"
    width = max(len(r.linears) for r in rows)
    lines = [f"{head} (M x N x K):"]
    for r in rows:
        mnk = "x".join(map(str, r.mnk))
        lines.append(f"  {r.linears:<{width}}  {r.role:<5}  {mnk:<17}  {r.path}: {r.why}")
    return "\n".join(lines)


def describe_gemm_paths(model: nn.Module, recipe: object, tokens: int, device: torch.device) -> str:
    """:func:`describe` of :func:`gemm_paths`: what the trainer prints at start. A missing library is a reason,
    not an error; a recipe that forces one it cannot have (``gemm: cutlass``) raises, as its first GEMM would."""
    return describe(gemm_paths(model, recipe, tokens, device), tokens)
