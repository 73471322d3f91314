"""Import a Hugging Face Qwen3 checkpoint (`Qwen3ForCausalLM` directory) as a trainer checkpoint, so a
run can start from it (`python -m trainer import-hf DIR --out CKPT`, or `init_from: {hf: DIR}`).

- Everything is checked before the weights are loaded (`trainer.hf_files`): config.json, the index,
  every safetensors header, and the config's sizes against the headers' shapes; each error names
  the file and the field or tensor.
- Tied checkpoints (the public Qwen3 0.6B/1.7B tie `lm_head` to the embedding) are untied on import:
  `lm_head.weight` becomes a copy of `model.embed_tokens.weight` (Puro §2.1 trains untied).
- RoPE: `rope_parameters: {rope_type: default, rope_theta}` (transformers 5) or `rope_theta`
  (transformers 4). Attention biases are refused. What the model does not express but a user may
  knowingly drop is refused by name unless `accept` lists it (`--accept` / `init_from.accept`):
  `rope_scaling` (any rope type but default, e.g. yarn: imported with plain RoPE),
  `sliding_window` (imported with full attention), `tie_word_embeddings` (the weights contradict
  the config's tied-ness: lm_head is taken from the embedding), `nonfinite` (NaN/Inf weights, named
  in a warning).
- `vocab_multiple`: the vocabulary is padded with zero rows up to a multiple (never a target; the
  zero LM-head rows give logit 0 until trained).
- Weights are stored as fp32 master weights; there is no optimizer state (`init_from` then starts
  the optimizer fresh). The module names are HF's already, so the rest is a shape-checked copy.
- An import is keyed by the source's content digest (and the options): importing a directory whose
  files changed writes it again; an unchanged one is reused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, get_args

import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from purokit import storage
from purokit.errors import ContractError
from purokit.log import get_logger
from trainer import checkpoint as ckpt
from trainer import hf_files
from trainer.config import HfAcceptable, padded_vocab
from trainer.export import hf_tensor_shapes
from trainer.model import ModelConfig

DEFAULT_ROPE_THETA = 10_000.0           # transformers' Qwen3Config default when a config names none
ACCEPTABLE: tuple[str, ...] = get_args(HfAcceptable)
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
log = get_logger("trainer.hf")


def check_accept(accept: Iterable[str]) -> frozenset[str]:
    unknown = sorted(set(accept) - set(ACCEPTABLE))
    if unknown:
        raise ContractError("accept", f"unknown {unknown}; known: {', '.join(ACCEPTABLE)}")
    return frozenset(accept)


def _rope_types(config: dict[str, Any], path: str | os.PathLike) -> set[str]:
    """The rope types a config names in `rope_parameters` and `rope_scaling` (both are read:
    transformers 4 configs carry `rope_scaling`, 5's `rope_parameters`)."""
    kinds = set()
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ContractError(path, f"expected an object, found {value!r:.60}", field=key)
        kinds.add(str(value.get("rope_type") or value.get("type") or "default"))
    return kinds or {"default"}


def _sliding(config: dict[str, Any]) -> bool:
    layer_types = config.get("layer_types") or []
    return bool(config.get("use_sliding_window")) or any(t != "full_attention" for t in layer_types)


def model_config_from_hf(config: dict[str, Any], path: str | os.PathLike = "config.json",
                         accept: frozenset[str] = frozenset()) -> ModelConfig:
    """The trainer's ModelConfig of an HF Qwen3 config.json; refuses what the model cannot express
    (unless `accept` names it)."""
    if config.get("model_type") not in ("qwen3", None):
        raise ContractError(path, f"model_type is {config.get('model_type')!r}; only qwen3 is imported", field="model_type")
    if config.get("attention_bias"):
        raise ContractError(path, "attention biases are not supported", field="attention_bias")
    if _sliding(config) and "sliding_window" not in accept:
        raise ContractError(path, "sliding-window attention is not supported (--accept sliding_window imports it "
                            "with full attention)", field="use_sliding_window")
    odd = sorted(_rope_types(config, path) - {"default"})
    if odd and "rope_scaling" not in accept:
        raise ContractError(path, f"rope type {odd[0]!r} is not supported, only default RoPE (--accept rope_scaling "
                            "imports it with plain RoPE)", field="rope_scaling" if config.get("rope_scaling")
                            else "rope_parameters")
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", DEFAULT_ROPE_THETA))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ContractError(path, f"rope_theta must be a number, found {theta!r:.60}", field="rope_parameters")
    heads = int(config["num_attention_heads"])
    try:
        return ModelConfig(
            vocab_size=int(config["vocab_size"]), d_model=int(config["hidden_size"]),
            n_layers=int(config["num_hidden_layers"]), n_heads=heads,
            n_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            d_ff=int(config["intermediate_size"]), max_seq_len=int(config.get("max_position_embeddings") or 4096),
            rope_theta=float(theta), norm_eps=float(config.get("rms_norm_eps") or 1e-6),
            init_std=float(config.get("initializer_range") or 0.02))
    except ValidationError as e:
        raise ContractError(path, f"not a model the trainer builds ({e.errors()[0]['msg']})") from None


def _field_checks(cfg: ModelConfig) -> list[tuple[str, str, int, int]]:
    """(config field, tensor, dimension, expected size): where a config field shows in the shapes."""
    p = "model.layers.0."
    return [("vocab_size", EMBED, 0, cfg.vocab_size), ("hidden_size", EMBED, 1, cfg.d_model),
            ("head_dim", p + "self_attn.q_norm.weight", 0, cfg.head_dim),
            ("num_attention_heads", p + "self_attn.q_proj.weight", 0, cfg.n_heads * cfg.head_dim),
            ("num_key_value_heads", p + "self_attn.k_proj.weight", 0, cfg.n_kv_heads * cfg.head_dim),
            ("intermediate_size", p + "mlp.gate_proj.weight", 0, cfg.d_ff)]


def check_shapes(config_path: Path, cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    """The config's sizes against the weights' shapes (from the headers), naming the field (a
    missing lm_head is the tied-ness check's, `untie_and_pad`)."""
    for field, tensor, dim, want in _field_checks(cfg):
        got = shapes.get(tensor)
        if got is not None and len(got) > dim and got[dim] != want:
            raise ContractError(config_path, f"{want} does not match {tensor} of shape {got}", field=field)
    layers = {int(k.split(".")[2]) for k in shapes if k.startswith("model.layers.") and k.split(".")[2].isdigit()}
    if layers and max(layers) + 1 != cfg.n_layers:
        raise ContractError(config_path, f"{cfg.n_layers} does not match the weights' {max(layers) + 1} layers",
                            field="num_hidden_layers")
    expected = hf_tensor_shapes(cfg)
    problems = [f"{k}: missing" for k in expected if k not in shapes and k != LM_HEAD]
    problems += [f"{k}: shape {shapes[k]}, expected {s}" for k, s in expected.items() if k in shapes and shapes[k] != s]
    problems += [f"{k}: not a Qwen3 tensor" for k in shapes if k not in expected]
    if problems:
        raise ContractError(config_path.parent, "weights do not match config.json: " + "; ".join(problems[:5]))


def load_hf_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of the weight files (their headers checked: `hf_files.tensor_shapes`)."""
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def check_finite(weights: dict[str, torch.Tensor], directory: Path, accept: frozenset[str]) -> None:
    """NaN/Inf weights are refused naming the tensors (with `nonfinite` accepted: a warning)."""
    bad = {k: int((~torch.isfinite(v)).sum()) for k, v in sorted(weights.items()) if v.is_floating_point()}
    bad = {k: n for k, n in bad.items() if n}
    if not bad:
        return
    named = "; ".join(f"{k}: {n} values" for k, n in list(bad.items())[:5])
    if "nonfinite" not in accept:
        raise ContractError(directory, f"non-finite (NaN/Inf) weights in {named} (--accept nonfinite imports them)")
    log.warning("%s: importing non-finite (NaN/Inf) weights in %s", directory, named)


def untie_and_pad(weights: dict[str, torch.Tensor], cfg: ModelConfig, tied: bool,
                  vocab_multiple: int | None, accept: frozenset[str] = frozenset(),
                  where: str | os.PathLike = "<hf>") -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """fp32 weights with an own lm_head (copied from the embedding when tied) and the vocabulary
    padded to `vocab_multiple` with zero rows. Weights that contradict the config's tied-ness
    (tied with a different lm_head, untied without one) are refused unless `tie_word_embeddings`
    is accepted; then lm_head is the embedding's copy."""
    w = {k: v.to(torch.float32) for k, v in weights.items()}
    contradiction = None
    if LM_HEAD not in w and not tied:
        contradiction = "is false but the weights have no lm_head.weight"
    elif tied and LM_HEAD in w and not torch.equal(w[LM_HEAD], w[EMBED]):
        contradiction = "is true but lm_head.weight differs from model.embed_tokens.weight"
    if contradiction and "tie_word_embeddings" not in accept:
        raise ContractError(Path(where) / hf_files.CONFIG, contradiction + " (--accept tie_word_embeddings takes "
                            "lm_head from the embedding)", field="tie_word_embeddings")
    if tied or LM_HEAD not in w:
        w[LM_HEAD] = w[EMBED].clone()
    V = padded_vocab(cfg.vocab_size, vocab_multiple)
    if V != cfg.vocab_size:
        for k in (EMBED, LM_HEAD):
            w[k] = torch.cat([w[k], w[k].new_zeros(V - cfg.vocab_size, w[k].shape[1])])
        cfg = cfg.model_copy(update={"vocab_size": V})
    return w, cfg


def import_hf(directory: str | os.PathLike, out: str | os.PathLike, vocab_multiple: int | None = None,
              accept: Iterable[str] = ()) -> str | os.PathLike:
    """Write `<out>/step_00000000`, a trainer checkpoint of the HF Qwen3 model in `directory`, and
    return it (reused when it is already there for the same source content and options). `out`
    may be an object-store URL."""
    if vocab_multiple is not None and (isinstance(vocab_multiple, bool) or vocab_multiple <= 0):
        raise ContractError("vocab_multiple", f"must be a positive integer, found {vocab_multiple!r}")
    accept = check_accept(accept)
    src = Path(directory)
    config = hf_files.read_hf_config(src)
    config_path = src / hf_files.CONFIG
    cfg = model_config_from_hf(config, config_path, accept)
    files = hf_files.weight_files(src)
    check_shapes(config_path, cfg, hf_files.tensor_shapes(src, files))
    target = storage.path(out) / ckpt.step_dir_name(0)
    source = {"hf": str(src.resolve()), "sha256": hf_files.source_digest(src, files),
              "vocab_multiple": vocab_multiple, "accept": sorted(accept)}
    if storage.has_committed(target, ckpt.STATE) and ckpt.read_state(target).sources == [source]:
        return target
    weights = load_hf_weights(files)
    check_finite(weights, src, accept)
    weights, cfg = untie_and_pad(weights, cfg, bool(config.get("tie_word_embeddings", False)), vocab_multiple,
                                 accept, src)
    state = ckpt.CheckpointState(step=0, tokens_seen=0, model=cfg.model_dump(mode="json"), sources=[source],
                                 config={"imported_from_hf": str(src)})
    ckpt.save_checkpoint(target, weights, None, state)
    return target
