"""Export to a Hugging Face Qwen3ForCausalLM directory: transformers loads it and reproduces the
trainer's logits in fp32 within 1e-4; config, tensor names and tokenizer files are right."""

import json

import pytest
import torch

from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.__main__ import main as trainer_main
from trainer.export import export_hf, hf_tensor_shapes
from trainer.model import ModelConfig, Transformer

from .conftest import ZEN


def test_hf_roundtrip_logits_match_in_fp32(trained_run, bpe, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export_hf(trained_run, tmp_path / "hf", dtype=torch.float32)
    cfg_json = json.loads((out / "config.json").read_text())
    assert cfg_json["architectures"] == ["Qwen3ForCausalLM"] and cfg_json["tie_word_embeddings"] is False
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    assert hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr()

    src = ckpt.resolve_checkpoint(trained_run)
    model_cfg = ModelConfig.model_validate(ckpt.read_state(src).model)
    ours = Transformer(model_cfg)
    ours.load_state_dict(ckpt.load_weights(src), strict=False)
    ours.eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok(ZEN.splitlines()[3], return_tensors="pt").input_ids
    assert ids.tolist()[0] == bpe["tok"].encode(ZEN.splitlines()[3])       # the same tokenizer
    assert tok.eos_token == "<|endoftext|>" and cfg_json["eos_token_id"] == bpe["tok"].eos_id
    x = torch.cat([ids, torch.randint(0, model_cfg.vocab_size, (1, 20))], dim=1)
    with torch.no_grad():
        ref = ours(x)
        got = hf(x).logits
    assert (ref - got).abs().max().item() <= 1e-4


def test_export_names_shapes_and_bf16_default(trained_run, tmp_path):
    from safetensors import safe_open

    out = export_hf(trained_run, tmp_path / "hf16")
    state = ckpt.read_state(ckpt.resolve_checkpoint(trained_run))
    expected = hf_tensor_shapes(ModelConfig.model_validate(state.model))
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(expected)
        for k in f.keys():
            t = f.get_tensor(k)
            assert tuple(t.shape) == expected[k] and t.dtype == torch.bfloat16
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "purokit_export.json").read_text())["step"] == 4


def test_export_refuses_a_tokenizer_other_than_the_shards_one(trained_run, tmp_path):
    from mixtures.tokenizers import train_bpe

    other = train_bpe(["completely different text " * 3] * 5, 300, tmp_path / "other")
    assert other.identity.digest
    with pytest.raises(ContractError, match="not the tokenizer"):
        export_hf(trained_run, tmp_path / "bad", tokenizer=tmp_path / "other")


def test_export_cli(trained_run, tmp_path, capsys):
    assert trainer_main(["export", "--checkpoint", str(trained_run), "--out", str(tmp_path / "cli"),
                         "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "model.safetensors").is_file()
