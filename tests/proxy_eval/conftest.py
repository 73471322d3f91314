"""Fixtures: a real byte-level BPE tokenizer trained here, and a tiny random Qwen3 model."""

from __future__ import annotations

import pytest

CORPUS = [
    "The cat sat on the mat. The dog sat on the log.",
    "Question: What is 2 + 3?\nAnswer: 2 + 3 = 5. The answer is 5.",
    "def add(a, b):\n    return a + b\n",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "import math\nprint(math.sqrt(16))\n",
    "Water boils at 100 degrees. Ice melts at 0 degrees.",
] * 20


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from proxy_eval.models import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen(tokenizer):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=False, rope_theta=10000.0)
    model = Qwen3ForCausalLM(cfg).eval()
    return model


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread, and far faster than on two when the CPU is shared
    (thread oversubscription); restored afterwards for other packages' tests."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tokenizer):
    """A trainer checkpoint of the tiny preset (256-token context), its head sharpened so that
    choices and greedy tokens are far apart."""
    import torch

    from trainer import checkpoint as ckpt
    from trainer.model import build_model, preset_config

    cfg = preset_config("tiny", vocab_size=tokenizer.vocab_size, max_seq_len=256)
    model = build_model(cfg, seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    root = tmp_path_factory.mktemp("tiny-run")
    state = ckpt.CheckpointState(step=1, tokens_seen=1, model=cfg.model_dump(mode="json"))
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("rope_")}
    return ckpt.save_checkpoint(root / "checkpoints" / ckpt.step_dir_name(1), weights, None, state)


@pytest.fixture(scope="session")
def exported_model(tiny_checkpoint, tokenizer_dir):
    """`tiny_checkpoint` exported to Hugging Face format (Qwen3ForCausalLM, float32)."""
    import torch

    from trainer.export import export_hf

    return export_hf(tiny_checkpoint, tiny_checkpoint.parent.parent / "hf", tokenizer=tokenizer_dir / "tokenizer.json",
                     dtype=torch.float32, eos_token="<|endoftext|>")
