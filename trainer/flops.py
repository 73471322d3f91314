"""FLOP accountant: model FLOPs per step, FP8 share, precision-weighted peak, MFU and tokens/s.

Convention (stated once, used by every report; PaLM-style "model FLOPs"):

- A step's model FLOPs are 3x the forward FLOPs of every matrix product: the seven Transformer
  linears (q, k, v, o, gate, up, down), the LM head, and the core attention products (Q K^T and
  P V). Forward FLOPs of a product are 2 x multiply-adds; backward costs twice the forward.
- Causal attention counts half of the s x s square (each query sees s/2 keys on average):
  forward 2 x 2 x (s/2) x (n_heads x head_dim) per token per layer.
- Not counted: activation recomputation, embeddings (a lookup), norms, RoPE, softmax, SwiGLU's
  elementwise product, the loss, the optimizer (MuonH's Newton-Schulz is reported as time instead).
- The FP8 share is the linears' part of that total (Puro §3.2: "FP8-accelerated operations account
  for 72% of the overall computation"; spec behaviour 27). The LM head and core attention stay BF16.
- MFU is reported against the **BF16 dense peak** for every run (so BF16 and FP8 runs compare on one
  scale and FP8 can exceed what BF16 could reach), and, for FP8 runs, also against the
  precision-weighted peak P_eff = (f/P_fp8 + (1 - f)/P_bf16)^-1 (Puro §4.3; behaviour 31), which is
  what Puro's 73% means. Tokens/s is always given beside MFU (anchors §0: MFU alone is ill-defined
  for mixed FP8/BF16 runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

TFLOP = 1e12


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Dense tensor-core peaks in FLOP/s."""

    name: str
    bf16: float
    fp8: float


H200 = Peaks("NVIDIA H200 SXM", bf16=989.5 * TFLOP, fp8=1979.0 * TFLOP)
RTX5090 = Peaks("NVIDIA RTX 5090", bf16=209.5 * TFLOP, fp8=419.0 * TFLOP)
PEAKS = {"h200": H200, "h100": dataclasses.replace(H200, name="NVIDIA H100 SXM"), "rtx5090": RTX5090}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The shapes that determine a dense Qwen3-style decoder's matmul FLOPs."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int

    @property
    def attn_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def linear_params_per_layer(self) -> int:
        """q, k, v, o, gate, up, down weights of one block (no biases)."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        return d * self.attn_dim + 2 * d * kv + self.attn_dim * d + 3 * d * self.d_ff

    @property
    def linear_params(self) -> int:
        return self.n_layers * self.linear_params_per_layer

    @property
    def lm_head_params(self) -> int:
        return self.d_model * self.vocab_size

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features K, out_features N) of each Transformer linear."""
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        return {
            "q": (d, self.attn_dim), "k": (d, kv), "v": (d, kv), "o": (self.attn_dim, d),
            "gate": (d, self.d_ff), "up": (d, self.d_ff), "down": (self.d_ff, d),
        }


# Public Qwen3 configurations (hidden, layers, heads, KV heads, head_dim, intermediate, vocab), with the
# LM head untied as in Puro §2.1. The trainer's own presets are read with `shape_from_config`.
QWEN3_SHAPES = {
    "0.6b": ModelShape(n_layers=28, d_model=1024, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072, vocab_size=151936),
    "1.7b": ModelShape(n_layers=28, d_model=2048, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144, vocab_size=151936),
}

_ALIASES = {
    "n_layers": ("n_layers", "num_layers", "num_hidden_layers", "n_layer", "layers"),
    "d_model": ("d_model", "hidden_size", "dim", "n_embd", "hidden"),
    "n_heads": ("n_heads", "num_heads", "num_attention_heads", "n_head"),
    "n_kv_heads": ("n_kv_heads", "num_kv_heads", "num_key_value_heads", "n_kv_head"),
    "head_dim": ("head_dim", "d_head"),
    "d_ff": ("d_ff", "intermediate_size", "ffn_dim", "ffn_hidden_size", "mlp_dim", "d_mlp"),
    "vocab_size": ("vocab_size", "n_vocab", "vocab"),
}


def shape_from_config(cfg: object) -> ModelShape:
    """Read a :class:`ModelShape` from a model config object or mapping (trainer presets, HF
    ``Qwen3Config``), trying the usual attribute names. ``n_kv_heads`` defaults to ``n_heads`` and
    ``head_dim`` to ``d_model / n_heads``."""

    def get(field: str):
        for name in _ALIASES[field]:
            value = cfg.get(name) if isinstance(cfg, Mapping) else getattr(cfg, name, None)
            if value is not None:
                return int(value)
        return None

    values = {f: get(f) for f in _ALIASES}
    if values["n_kv_heads"] is None:
        values["n_kv_heads"] = values["n_heads"]
    if values["head_dim"] is None and values["d_model"] and values["n_heads"]:
        values["head_dim"] = values["d_model"] // values["n_heads"]
    missing = [f for f, v in values.items() if v is None]
    if missing:
        raise ValueError(f"shape_from_config: {type(cfg).__name__} lacks {missing} (tried {[_ALIASES[m] for m in missing]})")
    return ModelShape(**values)


@dataclasses.dataclass(frozen=True)
class FlopBreakdown:
    """Model FLOPs (forward + backward) split by the precision they run in."""

    linears: float  # the seven Transformer linears: FP8 under fp8-blockwise
    lm_head: float  # BF16
    attention: float  # core attention products: BF16

    @property
    def total(self) -> float:
        return self.linears + self.lm_head + self.attention

    def fp8_share(self, fp8: bool = True) -> float:
        """Fraction of the FLOPs that run in FP8 (0 for a BF16 run)."""
        return self.linears / self.total if fp8 else 0.0

    def scaled(self, factor: float) -> FlopBreakdown:
        return FlopBreakdown(self.linears * factor, self.lm_head * factor, self.attention * factor)


def flops_per_token(shape: ModelShape, seq_len: int, causal: bool = True, backward: bool = True) -> FlopBreakdown:
    """Model FLOPs per token (see the module's convention); forward only when ``backward`` is False."""
    passes = 3.0 if backward else 1.0
    context = seq_len / 2 if causal else seq_len
    attention_fwd = shape.n_layers * 2 * 2 * context * shape.attn_dim
    return FlopBreakdown(
        linears=passes * 2 * shape.linear_params,
        lm_head=passes * 2 * shape.lm_head_params,
        attention=passes * attention_fwd,
    )


def step_flops(shape: ModelShape, seq_len: int, tokens_per_step: int, causal: bool = True) -> FlopBreakdown:
    return flops_per_token(shape, seq_len, causal).scaled(tokens_per_step)


def effective_peak(fp8_share: float, peak_fp8: float, peak_bf16: float) -> float:
    """Precision-weighted peak P_eff = (f/P_fp8 + (1 - f)/P_bf16)^-1 (Puro §4.3, behaviour 31)."""
    if not 0.0 <= fp8_share <= 1.0:
        raise ValueError(f"fp8_share must be in [0, 1], got {fp8_share}")
    return 1.0 / (fp8_share / peak_fp8 + (1.0 - fp8_share) / peak_bf16)


def throughput_report(
    shape: ModelShape,
    seq_len: int,
    tokens_per_step: int,
    step_time_s: float,
    fp8: bool,
    peaks: Peaks = H200,
    n_gpus: int = 1,
    causal: bool = True,
) -> dict[str, float]:
    """Tokens/s and MFU of a measured step, per GPU, under the module's convention."""
    flops = step_flops(shape, seq_len, tokens_per_step, causal)
    achieved = flops.total / step_time_s / n_gpus
    share = flops.fp8_share(fp8)
    p_eff = effective_peak(share, peaks.fp8, peaks.bf16)
    return {
        "tokens_per_s": tokens_per_step / step_time_s,
        "tokens_per_s_per_gpu": tokens_per_step / step_time_s / n_gpus,
        "model_tflops_per_s_per_gpu": achieved / TFLOP,
        "fp8_share": share,
        "mfu_vs_bf16_peak": achieved / peaks.bf16,
        "effective_peak_tflops": p_eff / TFLOP,
        "mfu_vs_effective_peak": achieved / p_eff,
        "flops_per_step": flops.total,
    }
