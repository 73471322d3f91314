"""FLOP accountant (spec behaviours 27 and 31)."""

from __future__ import annotations

import pytest

from trainer.flops import (
    H200,
    QWEN3_SHAPES,
    RTX5090,
    ModelShape,
    effective_peak,
    flops_per_token,
    shape_from_config,
    step_flops,
    throughput_report,
)


def test_qwen3_1_7b_parameter_counts_match_the_spec():
    shape = QWEN3_SHAPES["1.7b"]
    assert shape.linear_params == 1_409_286_144  # MuonH matrices, spec §5.1
    assert shape.lm_head_params == 311_164_928


def test_fp8_share_is_072_for_1_7b_at_4096():
    share = flops_per_token(QWEN3_SHAPES["1.7b"], 4096).fp8_share()
    assert share == pytest.approx(0.72, abs=0.005)
    # behaviour 27's derivation: forward FLOPs per token 2.82 + 0.62 + 0.47 GFLOP
    fwd = flops_per_token(QWEN3_SHAPES["1.7b"], 4096, backward=False)
    assert fwd.linears / 1e9 == pytest.approx(2.82, abs=0.01)
    assert fwd.lm_head / 1e9 == pytest.approx(0.62, abs=0.01)
    assert fwd.attention / 1e9 == pytest.approx(0.47, abs=0.01)
    assert flops_per_token(QWEN3_SHAPES["1.7b"], 4096).fp8_share(fp8=False) == 0.0


def test_fp8_share_falls_with_sequence_length_and_non_causal_attention_doubles():
    shape = QWEN3_SHAPES["1.7b"]
    assert flops_per_token(shape, 32768).fp8_share() < flops_per_token(shape, 4096).fp8_share()
    causal = flops_per_token(shape, 4096, causal=True).attention
    assert flops_per_token(shape, 4096, causal=False).attention == pytest.approx(2 * causal)


def test_effective_peak_and_puro_mfu():
    p_eff = effective_peak(0.72, RTX5090.fp8, RTX5090.bf16)
    assert p_eff / 1e12 == pytest.approx(327.3, abs=0.05)
    assert 238e12 / p_eff == pytest.approx(0.727, abs=0.0005)
    assert effective_peak(0.0, H200.fp8, H200.bf16) == H200.bf16
    assert effective_peak(1.0, H200.fp8, H200.bf16) == H200.fp8
    with pytest.raises(ValueError):
        effective_peak(1.5, 1.0, 1.0)


def test_throughput_report_is_consistent():
    shape = QWEN3_SHAPES["1.7b"]
    tokens = 8 * 4096
    flops = step_flops(shape, 4096, tokens).total
    step_s = flops / (500e12)  # a step at exactly 500 TFLOP/s
    r = throughput_report(shape, 4096, tokens, step_s, fp8=True)
    assert r["model_tflops_per_s_per_gpu"] == pytest.approx(500.0)
    assert r["mfu_vs_bf16_peak"] == pytest.approx(500 / 989.5)
    assert r["tokens_per_s"] == pytest.approx(tokens / step_s)
    assert r["mfu_vs_effective_peak"] < r["mfu_vs_bf16_peak"]
    bf = throughput_report(shape, 4096, tokens, step_s, fp8=False)
    assert bf["mfu_vs_effective_peak"] == pytest.approx(bf["mfu_vs_bf16_peak"])
    two = throughput_report(shape, 4096, tokens, step_s, fp8=False, n_gpus=2)
    assert two["tokens_per_s_per_gpu"] == pytest.approx(r["tokens_per_s"] / 2)


def test_shape_from_config_reads_common_names():
    hf_like = {
        "num_hidden_layers": 28, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936,
    }
    assert shape_from_config(hf_like) == QWEN3_SHAPES["1.7b"]

    class Preset:
        n_layers, d_model, n_heads, d_ff, vocab_size = 4, 256, 4, 512, 1000

    s = shape_from_config(Preset())
    assert s == ModelShape(4, 256, 4, 4, 64, 512, 1000)
    with pytest.raises(ValueError, match="lacks"):
        shape_from_config({"hidden_size": 8})


def test_linear_shapes_cover_the_seven_linears():
    shapes = QWEN3_SHAPES["0.6b"].linear_shapes()
    assert set(shapes) == {"q", "k", "v", "o", "gate", "up", "down"}
    assert shapes["q"] == (1024, 2048) and shapes["down"] == (3072, 1024)
    total = sum(k * n for k, n in shapes.values()) * QWEN3_SHAPES["0.6b"].n_layers
    assert total == QWEN3_SHAPES["0.6b"].linear_params
