"""The training loss: cross entropy of the LM head's logits, computed in chunks of tokens so that the
full (tokens, V) logits never exist at once, and never in fp32 (Liger's fused linear cross-entropy).

For each chunk of `chunk_tokens` rows of the final hidden states h (N, D):

    z = h_c W^T (compute dtype, BF16 on GPU)      lse = logsumexp(float(z))      loss_c = lse - z[target]
    dz = softmax(float(z)) - onehot(target)       (x the token's weight: 0 for ignored targets)
    dh_c = dz W        dW += dz^T h_c             (dW accumulated in fp32)

The gradients are computed in the forward pass (the loss is a sum, so the backward only scales them
by the incoming scalar), which needs no recomputation of z and stores only dh (N, D) and dW (V, D).
At 8 x 4096 tokens and V = 151,936 the full fp32 logits would be 20 GB (and as much again for their
gradient); a chunk of 32,768 tokens (one 8 x 4096 micro-batch, the fastest on the H200) holds 10 GB of BF16
logits and as much again for dz. One chunk per micro-batch gives dW in one GEMM (no fp32 accumulation pass
between chunks).

`chunk_fn` is the per-chunk computation; the training loop passes it through `torch.compile`, so
Inductor fuses the softmax, the target gather and the scaling into one pass over each chunk's logits.
"""

from __future__ import annotations

from typing import Callable

import torch

IGNORE = -100
DEFAULT_CHUNK_TOKENS = 32768


def chunk_loss_and_grads(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, token_w: torch.Tensor,
                         compute_dtype: torch.dtype, need_grads: bool = True):
    """One chunk: (sum of weighted token losses (fp32 scalar), dh (h's dtype), dW (fp32)) or, without
    `need_grads`, (loss sum, None, None). targets < 0 have weight 0 (their gradient is 0)."""
    hc, wc = h.to(compute_dtype), weight.to(compute_dtype)
    z = hc @ wc.t()                                                          # (n, V)
    zf = z.to(_acc_dtype(z))                                                 # fp32 (fp64 stays)
    lse = torch.logsumexp(zf, dim=-1)
    safe_t = targets.clamp_min(0)
    picked = zf.gather(1, safe_t[:, None]).squeeze(1)
    loss_sum = ((lse - picked) * token_w).sum()
    if not need_grads:
        return loss_sum, None, None
    # softmax - onehot as one pointwise expression (a scatter would make Inductor write fp32 dz first)
    onehot = torch.arange(z.shape[-1], device=z.device)[None, :] == safe_t[:, None]
    dz = ((torch.exp(zf - lse[:, None]) - onehot.to(zf.dtype)) * token_w[:, None]).to(compute_dtype)
    dh = (dz @ wc).to(h.dtype)
    dw = (dz.t() @ hc).to(_acc_dtype(z))
    return loss_sum, dh, dw


ChunkFn = Callable[..., tuple]


def _acc_dtype(h: torch.Tensor) -> torch.dtype:
    """The loss sum's dtype: fp32, or fp64 for fp64 inputs (the tests' reference precision)."""
    return torch.float64 if h.dtype == torch.float64 else torch.float32


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, token_w, chunk_tokens: int, compute_dtype: torch.dtype, chunk_fn):
        n = h.shape[0]
        total = torch.zeros((), dtype=_acc_dtype(h), device=h.device)
        dh = torch.empty_like(h)
        dw = None
        for start in range(0, n, chunk_tokens):
            stop = min(n, start + chunk_tokens)
            s, dh_c, dw_c = chunk_fn(h[start:stop], weight, targets[start:stop], token_w[start:stop],
                                     compute_dtype)
            total = total + s
            dh[start:stop] = dh_c
            dw = dw_c if dw is None else dw.add_(dw_c)
        ctx.save_for_backward(dh, dw)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad):
        # the incoming scale (1 / the global token count) multiplies in fp32: rounded to BF16 it would be off by
        # up to 0.4%, and differently for dh and dW
        dh, dw = ctx.saved_tensors
        return _scaled(dh, grad, dh.dtype), _scaled(dw, grad, ctx.weight_dtype), None, None, None, None, None


def _scaled(g: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """g x scale computed in at least fp32, returned in `dtype` (for an fp32 g, one kernel that multiplies in
    fp32 and stores in `dtype`: the LM head's dW into its BF16 compute copy)."""
    acc = torch.promote_types(torch.promote_types(g.dtype, torch.float32), scale.dtype)
    if g.dtype == acc:
        return torch.mul(g, scale.to(acc), out=torch.empty_like(g, dtype=dtype))
    return (g.to(acc) * scale.to(acc)).to(dtype)


def linear_cross_entropy_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             loss_mask: torch.Tensor | None = None, *,
                             chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                             compute_dtype: torch.dtype | None = None,
                             chunk_fn: ChunkFn = chunk_loss_and_grads) -> torch.Tensor:
    """Sum over tokens of mask x cross_entropy(h W^T, targets), never materializing all logits.

    h: (..., D) final hidden states; weight: (V, D) the LM head; targets: (...) ids (< 0 ignored);
    loss_mask: (...) token weights (None: 1). compute_dtype: the GEMM dtype (default: the autocast
    dtype when autocast is on, else h's). Differentiable in h and weight."""
    if compute_dtype is None:
        dev = h.device.type
        compute_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
    h2 = h.reshape(-1, h.shape[-1])
    t = targets.reshape(-1)
    w = (t >= 0).to(torch.float32)
    if loss_mask is not None:
        w = w * loss_mask.reshape(-1).to(torch.float32)
    with torch.autocast(h.device.type, enabled=False):
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return _LinearCrossEntropy.apply(h2, weight, t, w, chunk_tokens, compute_dtype, chunk_fn)
        total = torch.zeros((), dtype=_acc_dtype(h), device=h.device)
        for start in range(0, h2.shape[0], chunk_tokens):
            sl = slice(start, start + chunk_tokens)
            s, _, _ = chunk_fn(h2[sl], weight, t[sl], w[sl], compute_dtype, False)
            total = total + s
        return total


