"""Hugging Face Qwen3 import: a random tiny `Qwen3ForCausalLM` (tied, as the public 0.6B/1.7B are;
transformers 5's `rope_parameters`) is imported (untied, vocabulary padded), gives the same logits
as transformers, trains one step through `init_from: {hf: DIR}`, is exported, and transformers
loads the export with the trained model's logits."""

import json

import pytest
import torch

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import load_run_config
from trainer.export import export_hf
from trainer.hf import import_hf, model_config_from_hf
from trainer.model import ModelConfig, Transformer
from trainer.train import train

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    cfg = transformers.Qwen3Config(vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   max_position_embeddings=128, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    out = tmp_path_factory.mktemp("hf")
    model.save_pretrained(out)
    return out


def _trainer_model(checkpoint):
    model = Transformer(ModelConfig.model_validate(ckpt.read_state(checkpoint).model))
    model.load_state_dict(ckpt.load_weights(checkpoint), strict=False)
    return model.eval()


def test_import_unties_pads_and_gives_transformers_logits(hf_dir, tmp_path):
    d = import_hf(hf_dir, tmp_path / "ckpt", vocab_multiple=64)
    state = ckpt.read_state(d)
    assert state.model["vocab_size"] == 256 and state.model["rope_theta"] == 5000.0
    w = ckpt.load_weights(d)
    assert w["lm_head.weight"].data_ptr() != w["model.embed_tokens.weight"].data_ptr()
    torch.testing.assert_close(w["lm_head.weight"], w["model.embed_tokens.weight"])     # untied copies
    assert torch.all(w["lm_head.weight"][250:] == 0)
    ours = _trainer_model(d)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokens = torch.randint(0, 250, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens)[..., :250], hf(tokens).logits, rtol=1e-4, atol=1e-4)


def test_hf_round_trip_through_one_training_step(hf_dir, tmp_path):
    cfg = {"run_dir": str(tmp_path / "run"), "init_from": {"hf": str(hf_dir)},
           "data": {"synthetic": {"vocab_size": 250, "seq_len": 16}},
           "train": {"steps": 1, "global_batch": 2, "micro_batch": 2},
           "schedule": {"kind": "constant", "lr": 1e-2}, "log": {"progress": "none"}}
    train(load_run_config(None, data=cfg))
    final = ckpt.resolve_checkpoint(tmp_path / "run")
    trained = _trainer_model(final)
    start = ckpt.load_weights(import_hf(hf_dir, tmp_path / "run" / "init_hf"))
    assert not torch.equal(ckpt.load_weights(final)["model.layers.0.mlp.up_proj.weight"],
                           start["model.layers.0.mlp.up_proj.weight"])          # it did train
    out = export_hf(final, tmp_path / "export", dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = torch.randint(0, 250, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, trained(tokens), rtol=1e-4, atol=1e-4)
    again = ckpt.load_weights(import_hf(out, tmp_path / "again"))            # our own export imports back
    for k, v in ckpt.load_weights(final).items():
        torch.testing.assert_close(again[k], v)


def test_refuses_what_the_model_cannot_express(tmp_path):
    base = {"model_type": "qwen3", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2}
    assert model_config_from_hf({**base, "rope_theta": 1e6}).rope_theta == 1e6
    with pytest.raises(ContractError, match="rope type 'yarn'"):
        model_config_from_hf({**base, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})
    with pytest.raises(ContractError, match="attention_bias"):
        model_config_from_hf({**base, "attention_bias": True})
    with pytest.raises(ContractError, match="config.json"):
        import_hf(tmp_path, tmp_path / "out")


def test_import_hf_cli(hf_dir, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "trainer", "import-hf", str(hf_dir), "--out", str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ckpt.read_state(json.loads(out.stdout)["checkpoint"]).model["vocab_size"] == 250
