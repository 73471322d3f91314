"""Export a checkpoint as a Hugging Face `Qwen3ForCausalLM` directory (config.json with
`tie_word_embeddings: false`, model.safetensors with HF tensor names, the tokenizer files), loadable
by `transformers`, servable by vLLM and usable by standard evaluation harnesses.

The trainer's module names already are HF's (`model.layers.0.self_attn.q_proj.weight`, ...), so the
mapping is checked, not rewritten: every expected HF tensor must be present with the right shape.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from purokit import atomic
from purokit.errors import ContractError
from trainer import checkpoint as ckpt
from trainer.model import ModelConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "added_tokens.json", "generation_config.json")


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of Qwen3ForCausalLM (untied) with its shape."""
    D, Dh, F, V = cfg.d_model, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,),
                                       "lm_head.weight": (V, D)}
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (cfg.n_heads * Dh, D),
            p + "self_attn.k_proj.weight": (cfg.n_kv_heads * Dh, D),
            p + "self_attn.v_proj.weight": (cfg.n_kv_heads * Dh, D),
            p + "self_attn.o_proj.weight": (D, cfg.n_heads * Dh),
            p + "self_attn.q_norm.weight": (Dh,), p + "self_attn.k_norm.weight": (Dh,),
            p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D), p + "mlp.down_proj.weight": (D, F),
        })
    return out


def to_hf_state_dict(weights: dict[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    expected = hf_tensor_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ContractError("<checkpoint>", f"weights do not match Qwen3ForCausalLM: missing {missing[:4]}, extra {extra[:4]}")
    out = {}
    for k, shape in expected.items():
        if tuple(weights[k].shape) != shape:
            raise ContractError("<checkpoint>", f"tensor {k} has shape {tuple(weights[k].shape)}, expected {shape}")
        out[k] = weights[k].to(dtype).contiguous()
    return out


def hf_config(cfg: ModelConfig, dtype: torch.dtype, bos_token_id: int | None = None,
              eos_token_id: int | None = None, pad_token_id: int | None = None) -> dict[str, Any]:
    """config.json for Qwen3ForCausalLM (readable by transformers 4.51+ and 5.x: rope in both forms)."""
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": cfg.n_layers,
        "layer_types": ["full_attention"] * cfg.n_layers, "initializer_range": cfg.init_std,
        "use_cache": True, "torch_dtype": dtype_name, "dtype": dtype_name,
        "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id,
    }


def write_tokenizer(tokenizer: str | os.PathLike, out: Path, eos_token: str | None = None,
                    pad_token: str | None = None) -> dict[str, int | None]:
    """Copy a tokenizer directory's files, or turn a bare tokenizer.json into a full HF tokenizer
    (tokenizer_config.json with eos/pad). Returns the eos/pad/bos ids."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    src = Path(tokenizer)
    if src.is_file() and src.name == "tokenizer.json" and (src.parent / "tokenizer_config.json").is_file():
        src = src.parent                      # ship its tokenizer_config.json (chat template, specials) too
    if src.is_dir():
        files = [src / f for f in TOKENIZER_FILES if (src / f).is_file()]
        if not (src / "tokenizer.json").is_file() and not (src / "vocab.json").is_file():
            raise ContractError(src, "no tokenizer.json or vocab.json here")
        for f in files:
            if f.name != "generation_config.json":
                shutil.copy2(f, out / f.name)
        tok = AutoTokenizer.from_pretrained(str(out))
        if (eos_token and tok.eos_token is None) or (pad_token and tok.pad_token is None):
            tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"), eos_token=eos_token or tok.eos_token,
                                          pad_token=pad_token or tok.pad_token)
            tok.save_pretrained(str(out))
    elif src.is_file():
        tok = PreTrainedTokenizerFast(tokenizer_file=str(src), eos_token=eos_token, pad_token=pad_token or eos_token)
        tok.save_pretrained(str(out))
    else:
        raise ContractError(src, "tokenizer not found")
    return {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id}


def export_hf(checkpoint: str | os.PathLike, out: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
              dtype: torch.dtype = torch.bfloat16, eos_token: str | None = None) -> Path:
    """Write an HF Qwen3ForCausalLM directory from a trainer checkpoint (atomically).

    tokenizer: a tokenizer directory or tokenizer.json; by default the one recorded with the
    training shard set of the checkpoint's run (`tokenizer_for_checkpoint`)."""
    src = ckpt.resolve_checkpoint(checkpoint)
    state = ckpt.read_state(src)
    cfg = ModelConfig.model_validate(state.model)
    weights = to_hf_state_dict(ckpt.load_weights(src), cfg, dtype)
    tok_src, tok_eos = tokenizer_for_checkpoint(state, tokenizer)
    out = Path(out)
    with atomic.atomic_path(out) as tmp:
        tmp.mkdir()
        ids: dict[str, int | None] = {"eos_token_id": None, "pad_token_id": None, "bos_token_id": None}
        if tok_src is not None:
            ids = write_tokenizer(tok_src, tmp, eos_token=eos_token or tok_eos)
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg, dtype, **ids), indent=2) + "\n")
        gen = {k: v for k, v in ids.items() if v is not None}
        (tmp / "generation_config.json").write_text(json.dumps({**gen, "do_sample": False}, indent=2) + "\n")
        (tmp / "purokit_export.json").write_text(json.dumps({
            "source_checkpoint": str(src), "step": state.step, "kind": state.kind, "tokens_seen": state.tokens_seen,
            "dtype": str(dtype).removeprefix("torch."), "tokenizer": str(tok_src) if tok_src else None,
            "sources": state.sources}, indent=2, sort_keys=True) + "\n")
    return out


def tokenizer_for_checkpoint(state: ckpt.CheckpointState, explicit: str | os.PathLike | None = None
                             ) -> tuple[Path | None, str | None]:
    """The tokenizer to ship with an export: `explicit`, else the run's `data.tokenizer`, else a
    tokenizer.json stored with the run's training shard set. When the shard set is at hand, the
    tokenizer must be the one it was made with (its sha256 is in the shard manifest)."""
    from trainer.shards import check_tokenizer_file, shard_set_tokenizer

    data = state.config.get("data", {}) if state.config else {}
    shard_dir = data.get("train")
    have_shards = bool(shard_dir) and (Path(shard_dir) / "manifest.json").is_file()
    chosen = explicit or data.get("tokenizer")
    if chosen:
        return check_tokenizer_file(chosen, shard_dir) if have_shards else (Path(chosen), None)
    if have_shards:
        return shard_set_tokenizer(shard_dir)
    return None, None
