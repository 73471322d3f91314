"""The chunked linear cross-entropy equals the full-logit reference: values and gradients (h and the
LM head), with ignored targets, a token mask, chunks that do not divide the tokens, and no grad."""

import pytest
import torch

from trainer.loss import linear_cross_entropy_sum


@pytest.mark.parametrize("chunk", [5, 16, 1000])
def test_chunked_loss_and_grads_equal_the_full_logit_reference(chunk):
    torch.manual_seed(0)
    B, T, D, V = 3, 7, 16, 50
    h = torch.randn(B, T, D, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, D, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (B, T))
    targets[0, 2] = -100                                        # ignored
    mask = (torch.rand(B, T) > 0.3).double()
    got = linear_cross_entropy_sum(h, w, targets, mask, chunk_tokens=chunk)
    logits = h @ w.t()
    ref = (torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="none",
                                             ignore_index=-100).view(B, T) * mask).sum()   # fp64 reference
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    g = torch.tensor(0.37, dtype=torch.float64)
    dh, dw = torch.autograd.grad(got, (h, w), g.to(got.dtype))
    rh, rw = torch.autograd.grad(ref, (h, w), g)
    torch.testing.assert_close(dh, rh, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(dw, rw, rtol=1e-6, atol=1e-7)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy_sum(h, w, targets, mask, chunk_tokens=chunk).double(), ref,
                                   rtol=1e-6, atol=1e-6)


def test_the_incoming_scale_multiplies_in_fp32_for_bf16_inputs():
    """A loss scaled by 1/N (the loop's 1 / global token count) gives dh and dW scaled in fp32 and rounded once
    to their dtype: 1/3 rounded to BF16 first would be 0.2% off."""
    torch.manual_seed(0)
    h = torch.randn(64, 16).bfloat16().requires_grad_()
    w = torch.randn(50, 16).bfloat16().requires_grad_()
    targets = torch.randint(0, 50, (64,))
    loss = linear_cross_entropy_sum(h, w, targets, compute_dtype=torch.bfloat16)
    unit_dh, unit_dw = torch.autograd.grad(loss, (h, w), retain_graph=True)
    third = torch.tensor(1 / 3)
    dh, dw = torch.autograd.grad(loss * third, (h, w))
    assert torch.equal(dh, (unit_dh.float() * third).bfloat16())
    assert torch.equal(dw, (unit_dw.float() * third).bfloat16())
    assert not torch.equal(dh, unit_dh * third.bfloat16())             # what a BF16 scale would have given
