"""BF16 compute copies cast once a step: the same arithmetic as autocast on the fp32 masters, and the
masters back in place after the step (trainer.compute_copies)."""

import json

import pytest
import torch

import trainer.runtime as runtime
import trainer.train as train_mod
from trainer.compute_copies import ComputeCopies
from trainer.config import RunConfig
from trainer.loss import linear_cross_entropy_sum
from trainer.model import build_model, preset_config

from .conftest import run_config

SHAPE = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, max_seq_len=64)


def micro_loss(model, tokens):
    h = model.hidden(tokens[:, :-1])
    return linear_cross_entropy_sum(h, model.lm_head.weight, tokens[:, 1:])


def grads_two_micro_batches(model, batches, copies: ComputeCopies | None):
    model.zero_grad(set_to_none=True)
    with copies.swapped() if copies else torch.autocast("cpu", enabled=False):
        for tokens in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = micro_loss(model, tokens)
            (loss / 37.0).backward()
            if copies:
                copies.accumulate()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("compile", [False, True], ids=["eager-adds", "compiled-adds"])
def test_copies_give_autocasts_gradients_and_put_the_masters_back(compile):
    torch.manual_seed(0)
    model = build_model(preset_config("tiny", **SHAPE), seed=1)
    batches = [torch.randint(0, 97, (2, 17)) for _ in range(3)]
    reference = grads_two_micro_batches(model, batches, None)
    masters = {n: p for n, p in model.named_parameters()}
    copies = ComputeCopies(model, compile=compile)
    # every linear (7 a block and the LM head); no embedding, no norm gain
    assert len(copies) == 7 * 2 + 1
    got = grads_two_micro_batches(model, batches, copies)

    assert {n: p for n, p in model.named_parameters()} == masters            # the very tensors, back in place
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(c.grad is None for c in copies.copies)
    for name, g in reference.items():
        assert got[name].dtype == torch.float32, name
        if name != "lm_head.weight":
            # the blocks' weights (the same BF16 weight gradients summed in fp32) and the fp32 embedding: bit for bit
            assert torch.equal(got[name], g), name
        else:
            # the LM head: each micro-batch's gradient is rounded to BF16 on the copy (autocast kept the chunked
            # loss's fp32 gradient)
            assert ((got[name] - g).norm() / g.norm()).item() < 4e-3, name         # BF16's 2^-8, a few roundings


def test_the_masters_come_back_when_the_step_raises():
    model = build_model(preset_config("tiny", **SHAPE), seed=1)
    copies = ComputeCopies(model)
    with pytest.raises(RuntimeError, match="boom"):
        with copies.swapped():
            assert model.lm_head.weight.dtype == torch.bfloat16
            raise RuntimeError("boom")
    assert model.lm_head.weight is copies.masters[-1]
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_bf16_run_with_copies_tracks_the_autocast_run(shard_sets, tmp_path, monkeypatch):
    """The loop's BF16 path (one process): the losses of a short run stay within BF16 rounding of the same run
    with autocast's per-micro-batch casts, and the checkpoint holds fp32 masters."""
    def losses(name):
        cfg = RunConfig.model_validate(run_config(tmp_path / name, shard_sets, precision="bf16",
                                                  **{"train.steps": 4, "eval.every_steps": 0}))
        train_mod.train(cfg)
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    with_copies = losses("copies")
    monkeypatch.setattr(runtime, "ComputeCopies", lambda *args, **kwargs: None)
    without = losses("autocast")
    assert len(with_copies) == len(without) == 4
    for a, b in zip(with_copies, without):
        assert abs(a - b) <= 2e-2 * abs(b), (with_copies, without)
    from trainer import checkpoint as ckpt
    last = ckpt.list_checkpoints(tmp_path / "copies" / "checkpoints")[-1][1]
    assert all(t.dtype == torch.float32 for t in ckpt.load_weights(last, "cpu").values())


def test_the_fp32_gradients_live_in_buffers_reused_every_step():
    """Step after step (the loop's zero_grad(set_to_none=True) between), the masters' .grad is the same
    persistent buffer, overwritten by each step's first micro-batch: nothing of the previous step remains."""
    torch.manual_seed(0)
    model = build_model(preset_config("tiny", **SHAPE), seed=1)
    copies = ComputeCopies(model)
    step_a = [torch.randint(0, 97, (2, 17)) for _ in range(2)]
    step_b = [torch.randint(0, 97, (2, 17)) for _ in range(2)]
    grads_two_micro_batches(model, step_a, copies)
    storage = {id(p): p.grad.data_ptr() for p in copies.masters}
    got_b = grads_two_micro_batches(model, step_b, copies)          # zero_grad(set_to_none=True) first
    assert all(p.grad.data_ptr() == storage[id(p)] for p in copies.masters)
    fresh = ComputeCopies(model)
    want_b = grads_two_micro_batches(model, step_b, fresh)
    assert all(torch.equal(got_b[n], want_b[n]) for n in want_b)
    assert all(p.grad.data_ptr() != storage[id(p)] for p in fresh.masters)
