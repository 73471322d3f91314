"""A Qwen3-style dense decoder in plain PyTorch (Puro §2.1: Qwen3-1.7B shapes, untied embeddings).

Read top to bottom: config and presets, RMSNorm, rotary embeddings, attention (grouped-query heads,
QK-norm, `F.scaled_dot_product_attention` on the grouped heads; with document masking on CUDA, FlexAttention and a block
mask, so no dense (B, 1, T, T) mask exists), SwiGLU MLP, block, model.
Module and parameter names mirror Hugging Face's `Qwen3ForCausalLM` (`model.layers.3.self_attn.q_proj`
...) so export is a rename-free copy (`trainer.export`).

This file knows nothing of precision recipes or parallelism: FP8 is a module swap applied by
`trainer.fp8.convert_to_fp8` (FP8 linears, and the attention and MLP in their FP8 forms), data
parallelism a wrapper applied by the training loop (the torchtitan split). The forward has no data-dependent Python branches, so `torch.compile` traces it whole.

Shapes in comments: B batch, T sequence, D model width, H query heads, K key/value heads, Dh head
width, F MLP width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import model_validator

from purokit.config import StrictModel


class ModelConfig(StrictModel):
    """Shapes of the decoder. `vocab_size` normally comes from the shard set's tokenizer."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int = 4096
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        return self


QWEN3_VOCAB = 151_936

# Presets. `0.6b` and `1.7b` are Qwen3-0.6B / Qwen3-1.7B shapes (public configs) with the embedding
# untied from the LM head, as Puro does (§2.1); `50m` and `150m` are named by their non-embedding
# parameters. `tiny` is for tests and the CPU demo. `vocab_size` is overridden by the shard set.
PRESETS: dict[str, dict] = {
    # head_dim 32: the smallest vLLM's CPU attention serves (it supports 32, 64, 80, ... 512)
    "tiny": dict(vocab_size=QWEN3_VOCAB, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32,
                 d_ff=192, max_seq_len=1024),
    "50m": dict(vocab_size=QWEN3_VOCAB, d_model=512, n_layers=12, n_heads=8, n_kv_heads=4, head_dim=64,
                d_ff=2048),
    "150m": dict(vocab_size=QWEN3_VOCAB, d_model=1024, n_layers=12, n_heads=8, n_kv_heads=4, head_dim=128,
                 d_ff=3072),
    "0.6b": dict(vocab_size=QWEN3_VOCAB, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                 d_ff=3072),
    "1.7b": dict(vocab_size=QWEN3_VOCAB, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128,
                 d_ff=6144),
}


def preset_config(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32 like Qwen3's reference."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (max_seq_len, head_dim): frequencies theta^(-2i/Dh), duplicated halves."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)   # (T, Dh/2)
    angles = torch.cat((angles, angles), dim=-1)                                       # (T, Dh)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves (the GPT-NeoX / Qwen layout). x: (B, heads, T, Dh); cos, sin: (B, 1, T, Dh)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


def document_block_mask(doc_ids: torch.Tensor):
    """FlexAttention block mask: a token attends to earlier tokens of its own document only.

    doc_ids: (B, T) integers that change value at each document boundary (e.g. the running count of
    EOS tokens). Blocks of 128 x 128 that cross no boundary are skipped or computed unmasked, so the
    cost falls with the documents' length and no (B, T, T) tensor is built."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, T = doc_ids.shape

    def same_doc_causal(b, h, q, kv):
        return (doc_ids[b, q] == doc_ids[b, kv]) & (q >= kv)

    return create_block_mask(same_doc_causal, B, None, T, T, device=doc_ids.device)


def dense_document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """The same mask as a dense (B, 1, T, T) boolean tensor (True = may attend), for CPU, where
    FlexAttention has no backward; the reference the block mask is tested against."""
    T = doc_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]


def document_mask(doc_ids: torch.Tensor):
    """The attention mask of packed documents: a FlexAttention block mask on CUDA, dense on CPU."""
    return document_block_mask(doc_ids) if doc_ids.is_cuda else dense_document_mask(doc_ids)


def _flex_attention(q, k, v, block_mask):
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)     # QK-norm, per head
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, key and value projections of the normed input."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project_qkv(x)
        q = self.q_norm(q.view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)         # (B,H,T,Dh)
        k = self.k_norm(k.view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)      # (B,K,T,Dh)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)                   # (B,K,T,Dh)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # grouped KV heads go to the kernel as they are (no expansion to H heads): on the H200 causal
        # SDPA fwd+bwd at the 1.7B layer took 2.09 ms grouped against 2.34 ms expanded (RESULTS.md, issue 15)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif isinstance(mask, torch.Tensor):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        else:
            y = _flex_attention(q, k, v, mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(up(x) * silu(gate(x)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down_proj = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.up_proj(x) * F.silu(self.gate_proj(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        # the normed inputs in the residual stream's dtype (BF16 under autocast): what the linears compute
        # with anyway (autocast casts them so for BF16 GEMMs), and a quantizing linear, an opaque kernel
        # to Inductor, then reads 2 bytes a value instead of the norm's float32 output
        x = x + self.self_attn(self.input_layernorm(x).to(x.dtype), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x).to(x.dtype))


class Decoder(nn.Module):
    """Embedding, blocks, final norm (HF's `model.*` part)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class Transformer(nn.Module):
    """Qwen3-style causal LM with an untied LM head. `forward` returns logits (B, T, V)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) for embeddings and linears; residual outputs (o_proj, down_proj)
        scaled by 1/sqrt(2 n_layers) (GPT-2). Every matrix is non-zero: MuonH fixes each matrix's
        radius at its initial Frobenius norm (Puro Eq. 1), so a zero matrix would stay zero."""
        std = self.cfg.init_std
        residual_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, residual_std, generator=generator)
            elif p.ndim == 2:
                p.normal_(0.0, std, generator=generator)
            else:
                p.fill_(1.0)                              # norm gains
        if self.rope_cos.device.type != "meta":
            cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
               doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T) -> final normed hidden states (B, T, D), the LM head's input.

        positions (B, T): rotary positions (default 0..T-1; pass per-document positions to restart
        them at each document). doc_ids (B, T): when given, attention is masked to each document.
        """
        B, T = tokens.shape
        if positions is None:
            cos = self.rope_cos[:T][None, None]                                 # (1,1,T,Dh)
            sin = self.rope_sin[:T][None, None]
        else:
            cos = self.rope_cos[positions][:, None]                             # (B,1,T,Dh)
            sin = self.rope_sin[positions][:, None]
        x = self.model.embed_tokens(tokens)                                     # (B,T,D)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if torch.is_autocast_enabled(x.device.type):
            # the residual stream in the compute dtype (BF16 on GPU), as in a BF16 model (HF Qwen3,
            # torchtitan's BF16 parameters): half the bytes of every residual add, norm input, saved
            # activation and residual gradient; norms still compute in fp32
            x = x.to(torch.get_autocast_dtype(x.device.type))
        mask = None if doc_ids is None else document_mask(doc_ids)
        for block in self.model.layers:
            x = block(x, cos, sin, mask)
        return self.model.norm(x)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, V); see `hidden`."""
        return self.lm_head(self.hidden(tokens, positions, doc_ids))            # (B,T,V)


def build_model(cfg: ModelConfig, seed: int = 0, device: str | torch.device = "cpu") -> Transformer:
    """Construct and initialize deterministically from `seed` (the same seed gives the same weights)."""
    with torch.device(device):
        model = Transformer(cfg)
    if torch.device(device).type != "meta":
        gen = torch.Generator(device=device).manual_seed(seed)
        model.init_weights(gen)
    return model


def count_params(model: nn.Module) -> dict[str, int]:
    """Total, embedding, LM head and non-embedding parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    embed = model.model.embed_tokens.weight.numel()
    head = model.lm_head.weight.numel()
    return {"total": total, "embedding": embed, "lm_head": head, "non_embedding": total - embed - head}


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy in fp32, shape of `targets`. Targets < 0 give 0 (ignored)."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1), reduction="none",
                           ignore_index=-100).view(targets.shape)
