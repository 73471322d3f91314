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


def cuda_run(run_dir, precision: str, steps: int, detail_every: int) -> dict:
    """A small compiled run on synthetic tokens, as a config dict."""
    return {"run_dir": str(run_dir), "precision": precision, "compile": True,
            "model": {"preset": "tiny", "overrides": {"d_model": 256, "n_heads": 4, "n_kv_heads": 2, "head_dim": 64,
                                                      "d_ff": 512}},
            "data": {"synthetic": {"vocab_size": 512, "seq_len": 256}},
            "train": {"steps": steps, "global_batch": 8, "micro_batch": 4},
            "schedule": {"kind": "constant", "lr": 3e-3, "warmup_steps": 2},
            "checkpoint": {"every_steps": 0, "at_end": False},
            "log": {"progress": "none", "detail_every": detail_every}}


@pytest.mark.parametrize("precision", ["bf16", "fp8-blockwise"])
def test_compiled_loop_trains_on_cuda(tmp_path, precision):
    train(load_run_config(None, data=cuda_run(tmp_path / precision, precision, steps=12, detail_every=4)))
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


@pytest.mark.parametrize("rule", ["muonh", "muon"])
def test_compiled_matrix_step_equals_the_eager_step_on_cuda(rule):
    """The compiled per-shape step (one CUDA process) gives the eager step's matrices, momentum and rho,
    and changing the learning rate does not recompile it."""
    from trainer.optim import MatrixOptimizer

    torch.manual_seed(0)
    shapes = [(256, 128)] * 3 + [(128, 384)] * 2
    def make(compile):
        ps = [torch.nn.Parameter(torch.randn(*s, device="cuda", generator=torch.Generator("cuda").manual_seed(i)))
              for i, s in enumerate(shapes)]
        # Newton-Schulz in fp32: in BF16 the compiled pre-normalization (an fp32 reduction) and the eager one
        # round differently, and five iterations amplify that beyond any tolerance that would still test something
        return ps, MatrixOptimizer([dict(params=ps, name="m", lr_mult=10.0)], rule=rule, weight_decay=0.1,
                                   ns_dtype="float32", compile=compile)
    (eager_ps, eager), (comp_ps, comp) = make(False), make(True)
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(error_on_recompile=False):
        for step in range(4):
            grads = [torch.randn(*s, device="cuda") for s in shapes]
            for opt, ps in ((eager, eager_ps), (comp, comp_ps)):
                for p, g in zip(ps, grads):
                    p.grad = g.clone()
                opt.param_groups[0]["lr"] = 0.01 * (step + 1)
                opt.step()
            for a, b in zip(eager_ps, comp_ps):
                torch.testing.assert_close(b, a, rtol=2e-3, atol=2e-4)
            for a, b in zip(eager.last_effective_lr["m"], comp.last_effective_lr["m"]):
                assert abs(a - b) <= 1e-3 * abs(a)
    for a, b in zip(eager_ps, comp_ps):
        torch.testing.assert_close(comp.state[b]["momentum_buffer"], eager.state[a]["momentum_buffer"])
    assert counters["stats"]["unique_graphs"] <= 2            # one graph per shape, whatever the learning rate


def test_compute_copies_on_cuda_give_autocasts_block_gradients():
    """The compiled fp32 additions on the side stream: the gradients bit for bit as autocast's (the blocks', in
    fp32 the embedding's), the LM head's within its BF16 rounding."""
    from trainer.compute_copies import ComputeCopies
    from trainer.model import build_model, preset_config

    torch.manual_seed(0)
    model = build_model(preset_config("tiny", vocab_size=512, d_model=256, n_heads=4, n_kv_heads=2, head_dim=64,
                                      d_ff=512), seed=1, device="cuda")
    batches = [torch.randint(0, 512, (4, 257), device="cuda") for _ in range(4)]

    def grads(copies):
        model.zero_grad(set_to_none=True)
        with copies.swapped() if copies else torch.autocast("cuda", enabled=False):
            for tokens in batches:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    h = model.hidden(tokens[:, :-1])
                    loss = linear_cross_entropy_sum(h, model.lm_head.weight, tokens[:, 1:])
                (loss / 1000.0).backward()
                if copies:
                    copies.accumulate()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    reference = grads(None)
    copies = ComputeCopies(model, compile=True)
    assert copies.stream is not None
    got = grads(copies)
    for name, g in reference.items():
        if name != "lm_head.weight":
            assert torch.equal(got[name], g), name
        else:
            assert ((got[name] - g).norm() / g.norm()).item() < 4e-3, name


@pytest.mark.parametrize("precision", ["bf16", "fp8-blockwise"])
def test_a_step_of_the_loop_never_waits_for_the_gpu(tmp_path, monkeypatch, precision):
    """The loop's only host synchronization is `StepRecords` reading a step's loss after the next step
    is queued: under CUDA's sync debug mode set to "error", every step after the compiling ones (the
    micro-batches' copies, forward, backward, fp32 gradient additions, clip, MuonH, AdamW) is queued
    without one synchronizing call."""
    import trainer.train as loop

    real, calls = loop.Stepper.__call__, {"n": 0}

    def strict(self, micro, denom, detail=False):
        calls["n"] += 1
        if calls["n"] <= 2:                       # compilation and the optimizers' lazy state
            return real(self, micro, denom, detail)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real(self, micro, denom, detail)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(loop.Stepper, "__call__", strict)
    train(load_run_config(None, data=cuda_run(tmp_path / precision, precision, steps=5, detail_every=1000)))
    assert calls["n"] == 5
