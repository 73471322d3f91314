"""Import a Hugging Face Qwen3 checkpoint (`Qwen3ForCausalLM` directory) as a trainer checkpoint, so a
run can start from it (`python -m trainer import-hf DIR --out CKPT`, or `init_from: {hf: DIR}`).

- Tied checkpoints (the public Qwen3 0.6B/1.7B tie `lm_head` to the embedding) are untied on import:
  `lm_head.weight` becomes a copy of `model.embed_tokens.weight` (Puro §2.1 trains untied).
- RoPE: `rope_parameters: {rope_type: default, rope_theta}` (transformers 5) or `rope_theta`
  (transformers 4); any other rope type (scaling) is refused, as are attention biases and sliding windows.
- `vocab_multiple`: the vocabulary is padded with zero rows up to a multiple (never a target; the
  zero LM-head rows give logit 0 until trained).
- Weights are stored as fp32 master weights; there is no optimizer state (`init_from` then starts
  the optimizer fresh). The module names are HF's already, so the rest is a shape-checked copy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from common.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.config import padded_vocab
from trainer.export import hf_tensor_shapes
from trainer.model import ModelConfig

DEFAULT_ROPE_THETA = 10_000.0           # transformers' Qwen3Config default when a config names none


def model_config_from_hf(config: dict[str, Any], path: str | os.PathLike = "config.json") -> ModelConfig:
    """The trainer's ModelConfig of an HF Qwen3 config.json; refuses what the model cannot express."""
    if config.get("model_type") not in ("qwen3", None):
        raise ContractError(path, f"model_type is {config.get('model_type')!r}; only qwen3 is imported", field="model_type")
    if config.get("attention_bias"):
        raise ContractError(path, "attention biases are not supported", field="attention_bias")
    if config.get("use_sliding_window"):
        raise ContractError(path, "sliding-window attention is not supported", field="use_sliding_window")
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ContractError(path, f"rope type {rope_type!r} is not supported (only default RoPE)", field="rope_parameters")
    theta = rope.get("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA))
    heads = int(config["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(config["vocab_size"]), d_model=int(config["hidden_size"]),
        n_layers=int(config["num_hidden_layers"]), n_heads=heads,
        n_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
        d_ff=int(config["intermediate_size"]), max_seq_len=int(config.get("max_position_embeddings", 4096)),
        rope_theta=float(theta), norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        init_std=float(config.get("initializer_range", 0.02)))


def load_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, or of the shards its index lists."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ContractError(directory, "no model.safetensors (or model.safetensors.index.json) here")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(directory / f)))
    return out


def untie_and_pad(weights: dict[str, torch.Tensor], cfg: ModelConfig, tied: bool,
                  vocab_multiple: int | None) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """fp32 weights with an own lm_head (copied from the embedding when tied) and the vocabulary
    padded to `vocab_multiple` with zero rows."""
    w = {k: v.to(torch.float32) for k, v in weights.items()}
    if "lm_head.weight" not in w:
        if not tied:
            raise ContractError("<hf>", "no lm_head.weight and tie_word_embeddings is false")
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()
    V = padded_vocab(cfg.vocab_size, vocab_multiple)
    if V != cfg.vocab_size:
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            w[k] = torch.cat([w[k], w[k].new_zeros(V - cfg.vocab_size, w[k].shape[1])])
        cfg = cfg.model_copy(update={"vocab_size": V})
    return w, cfg


def import_hf(directory: str | os.PathLike, out: str | os.PathLike, vocab_multiple: int | None = None) -> Path:
    """Write `<out>/step_00000000`, a trainer checkpoint of the HF Qwen3 model in `directory`, and
    return it (reused when it is already there for the same source)."""
    src = Path(directory)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ContractError(src, "no config.json: not a Hugging Face model directory")
    config = json.loads(config_path.read_text())
    cfg = model_config_from_hf(config, config_path)
    target = Path(out) / ckpt.step_dir_name(0)
    source = {"hf": str(src.resolve()), "vocab_multiple": vocab_multiple}
    if (target / ckpt.STATE).is_file() and ckpt.read_state(target).sources == [source]:
        return target
    weights, cfg = untie_and_pad(load_hf_weights(src), cfg, bool(config.get("tie_word_embeddings", False)),
                                 vocab_multiple)
    expected = hf_tensor_shapes(cfg)
    problems = [f"{k}: missing" for k in expected if k not in weights]
    problems += [f"{k}: shape {tuple(weights[k].shape)}, expected {s}" for k, s in expected.items()
                 if k in weights and tuple(weights[k].shape) != s]
    problems += [f"{k}: not a Qwen3 tensor" for k in weights if k not in expected]
    if problems:
        raise ContractError(src, "weights do not match the config: " + "; ".join(problems[:5]))
    state = ckpt.CheckpointState(step=0, tokens_seen=0, model=cfg.model_dump(mode="json"), sources=[source],
                                 config={"imported_from_hf": str(src)})
    ckpt.save_checkpoint(target, weights, None, state)
    return target
