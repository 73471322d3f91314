"""Open a model for scoring: a trainer checkpoint (safetensors + state.json) or a Hugging Face
model directory (for instance the trainer's `Qwen3ForCausalLM` export). Both become a
`CausalLMScorer`, so the same suite gives the same scores on either (the logits agree)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from purokit.errors import ContractError
from mixtures.tokenizers import load_tokenizer as mixtures_tokenizer
from trainer import checkpoint as ckpt
from trainer.export import tokenizer_for_checkpoint
from trainer.model import ModelConfig, build_model
from proxy_eval.models import CausalLMScorer, HFCausalLMScorer, TorchModuleScorer, load_tokenizer


def is_hf_model_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    if not (p / "config.json").is_file():
        return False
    try:
        return "architectures" in json.loads((p / "config.json").read_text()) or "model_type" in json.loads(
            (p / "config.json").read_text())
    except json.JSONDecodeError:
        return False


def open_tokenizer(spec: Any) -> Any:
    """A tokenizer from a path (tokenizer.json or its directory) or a mixtures `tokenizer:` block
    (dict / TokenizerSpec: hf, tiktoken or qwen3)."""
    if spec is None:
        return None
    if isinstance(spec, (str, os.PathLike)):
        return load_tokenizer(spec)
    return mixtures_tokenizer(spec)


def load_trainer_model(checkpoint: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, Any]:
    """The trainer's model with a checkpoint's weights (fp32), and the checkpoint state."""
    src = ckpt.resolve_checkpoint(checkpoint)
    state = ckpt.read_state(src)
    cfg = ModelConfig.model_validate(state.model)
    model = build_model(cfg, seed=0, device=device)
    weights = {k: v.float() for k, v in ckpt.load_weights(src, device).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("rope_")]
    if missing or unexpected:
        raise ContractError(src, f"weights do not fit the model (missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model.eval(), state


def trainer_checkpoint_tokenizer(state: Any) -> Any:
    """The tokenizer a trainer checkpoint was trained with: its run's data.tokenizer, else the one
    stored beside its training shard set."""
    data = (state.config or {}).get("data", {})
    if data.get("tokenizer"):
        return open_tokenizer(data["tokenizer"])
    path, eos = tokenizer_for_checkpoint(state)
    return load_tokenizer(path, eos_token=eos) if path is not None else None


def open_scorer(path: str | os.PathLike, tokenizer: Any = None, device: str = "cpu", max_length: int | None = None,
                name: str | None = None, prefix_token_id: int | None = None,
                prefix_contexts: bool = False) -> CausalLMScorer:
    """A scorer for a trainer checkpoint (or run / checkpoints directory: the latest) or an HF model
    directory. `tokenizer`: a path, a mixtures tokenizer block, or a loaded tokenizer; default: the
    model's own (HF directory) or the one recorded for the checkpoint's training data."""
    p = Path(path)
    loaded = tokenizer is None or (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode")
                                   and not isinstance(tokenizer, (str, bytes)))
    tok = tokenizer if loaded else open_tokenizer(tokenizer)
    kw: dict[str, Any] = {"device": device, "name": name or p.name, "prefix_token_id": prefix_token_id,
                          "prefix_contexts": prefix_contexts}
    if is_hf_model_dir(p):
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32)
        tok = tok or load_tokenizer(p)
        return HFCausalLMScorer(model, tok, max_length=max_length, **kw)
    model, state = load_trainer_model(p, device)
    tok = tok or trainer_checkpoint_tokenizer(state)
    if tok is None:
        raise ContractError(p, "no tokenizer recorded for this checkpoint; pass one (--tokenizer)")
    return TorchModuleScorer(model, tok, max_length=max_length or model.cfg.max_seq_len, **kw)
