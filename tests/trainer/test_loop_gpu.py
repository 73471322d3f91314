"""The training loop on CUDA as `python -m trainer train` runs it: compiled per block with the compiled
loss chunk, BF16 and blockwise FP8, finite and falling losses, MFU and peak memory in metrics.jsonl;
the chunked loss equals the full-logit loss on the GPU. Marked `gpu`; skipped without CUDA."""

import json

import pytest
import torch

from trainer.config import load_run_config
from trainer.loss import chunk_loss_and_grads, linear_cross_entropy_sum
from trainer.model import token_losses
from trainer.train import train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("precision", ["bf16", "fp8-blockwise"])
def test_compiled_loop_trains_on_cuda(tmp_path, precision):
    cfg = {"run_dir": str(tmp_path / precision), "precision": precision, "compile": True,
           "model": {"preset": "tiny", "overrides": {"d_model": 256, "n_heads": 4, "n_kv_heads": 2, "head_dim": 64,
                                                     "d_ff": 512}},
           "data": {"synthetic": {"vocab_size": 512, "seq_len": 256}},
           "train": {"steps": 12, "global_batch": 8, "micro_batch": 4},
           "schedule": {"kind": "constant", "lr": 3e-3, "warmup_steps": 2},
           "checkpoint": {"every_steps": 0, "at_end": False}, "log": {"progress": "none", "detail_every": 4}}
    train(load_run_config(None, data=cfg))
    recs = [json.loads(line) for line in (tmp_path / precision / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in recs if r["kind"] == "train"]
    assert len(train_recs) == 12
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train_recs)
    assert train_recs[-1]["loss"] < train_recs[0]["loss"] - 0.5
    assert all(r["peak_mem_gib"] > 0 for r in train_recs)
    if "H100" in torch.cuda.get_device_name() or "H200" in torch.cuda.get_device_name():
        assert all(0 < r["mfu"] < 1 for r in train_recs)
    assert "zero_grad_frac" in train_recs[3] and "zero_grad_frac" not in train_recs[0]


def test_compiled_chunked_loss_matches_full_logits_on_cuda():
    torch.manual_seed(0)
    h = torch.randn(3000, 256, device="cuda", requires_grad=True)
    w = (0.05 * torch.randn(4096, 256, device="cuda")).requires_grad_()
    t = torch.randint(0, 4096, (3000,), device="cuda")
    got = linear_cross_entropy_sum(h, w, t, chunk_tokens=1024, compute_dtype=torch.bfloat16,
                                   chunk_fn=torch.compile(chunk_loss_and_grads))
    ref = token_losses((h.bfloat16() @ w.bfloat16().t()).float(), t).sum()
    torch.testing.assert_close(got, ref, rtol=2e-3, atol=1e-2)
    dh, dw = torch.autograd.grad(got, (h, w))
    rh, rw = torch.autograd.grad(ref, (h, w))
    assert (dh - rh).norm() / rh.norm() < 1e-2 and (dw - rw).norm() / rw.norm() < 1e-2
