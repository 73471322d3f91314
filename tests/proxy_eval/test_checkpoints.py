"""A trainer checkpoint and its Hugging Face export score the same on every task format."""

from __future__ import annotations

import json

import pytest
import torch

from proxy_eval.evaluate import evaluate_suite
from proxy_eval.loading import is_hf_model_dir, open_scorer
from tests.proxy_eval.test_tasks import _suite


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory, tokenizer):
    from trainer import checkpoint as ckpt
    from trainer.model import build_model, preset_config

    cfg = preset_config("tiny", vocab_size=tokenizer.vocab_size, max_seq_len=96)
    model = build_model(cfg, seed=3)
    with torch.no_grad():   # random init is nearly uniform; sharpen it so scores differ across choices
        model.lm_head.weight.mul_(40.0)
    root = tmp_path_factory.mktemp("ckpt")
    state = ckpt.CheckpointState(step=7, tokens_seen=700, model=cfg.model_dump(mode="json"))
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("rope_")}
    return ckpt.save_checkpoint(root / "checkpoints" / ckpt.step_dir_name(7), weights, None, state)


def test_exported_hf_model_scores_like_the_trainer_checkpoint(tmp_path, tokenizer_dir, trainer_checkpoint):
    from trainer.export import export_hf

    out = export_hf(trainer_checkpoint, tmp_path / "hf", tokenizer=tokenizer_dir / "tokenizer.json",
                    dtype=torch.float32, eos_token="<|endoftext|>")
    assert is_hf_model_dir(out) and not is_hf_model_dir(trainer_checkpoint)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    suite = _suite(tmp_path)
    native = open_scorer(trainer_checkpoint.parent.parent, tokenizer=tokenizer_dir)   # a run dir: latest checkpoint
    hf = open_scorer(out)
    assert native.prefix_token_id == hf.prefix_token_id and native.max_length == hf.max_length == 96
    a, b = evaluate_suite(native, suite), evaluate_suite(hf, suite)
    for ra, rb in zip(a.results, b.results):
        assert ra.value == pytest.approx(rb.value, abs=1e-4), ra.task
        if ra.format == "multiple_choice":
            for sa, sb in zip(ra.samples, rb.samples):
                assert sa["cloze"]["loglikelihoods"] == pytest.approx(sb["cloze"]["loglikelihoods"], abs=1e-3)
        if ra.format == "generate":
            assert [s["generation"] for s in ra.samples] == [s["generation"] for s in rb.samples]
    # the models are not degenerate: the choices get different log-likelihoods
    lls = a.results[0].samples[0]["cloze"]["loglikelihoods"]
    assert max(lls) - min(lls) > 0.1
