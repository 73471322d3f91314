"""Blockwise FP8 (Puro §3.2; spec behaviours 26-27): quantizers, emulated GEMMs, gradients, converter.

All on CPU through the exact emulation; the CUDA kernels are checked against it in test_fp8_gpu.py.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.fp8 import (
    E4M3_MAX,
    GROUP,
    Fp8Linear,
    Fp8Recipe,
    convert_to_fp8,
    dequantize_1x128,
    dequantize_128x128,
    fp8_linear,
    fp8_module_names,
    quantize_1x128,
    quantize_128x128,
    resolve_recipe,
    scales_from_amax,
)
from trainer.fp8.gemm import emulated_dgrad, emulated_fprop, emulated_wgrad

E4M3_MIN_NORMAL = 2.0**-6


def _spread(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Gaussian values whose rows span many binades, so groups get very different scales."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-20, 21, (rows, 1), generator=g).float())
    return torch.randn(rows, cols, generator=g) * mag


def _is_pow2(s: torch.Tensor) -> bool:
    mantissa, _ = torch.frexp(s)
    return bool((mantissa == 0.5).all())


# ---------------------------------------------------------------------------------- scales


def test_pow2_scale_is_the_smallest_power_of_two_that_fits():
    g = torch.Generator().manual_seed(0)
    amax = torch.exp2(torch.empty(20000).uniform_(-60, 60, generator=g))
    edge = torch.tensor([448.0, 449.0, 447.0, 256.0, 224.0, 896.0, 1.0, 3.5, 1.75 * 2**-30, 2.0**-50])
    amax = torch.cat([amax, edge, torch.nextafter(edge, torch.tensor(0.0)), torch.nextafter(edge, torch.tensor(1e30))])
    s, inv = scales_from_amax(amax, "pow2")
    assert _is_pow2(s)
    assert torch.equal(s * inv, torch.ones_like(s))
    a = amax.double()
    assert bool((a / s.double() <= E4M3_MAX).all()), "amax must fit under 448 after scaling"
    assert bool((a / (s.double() / 2) > E4M3_MAX).all()), "half the scale must overflow (minimality)"
    expected = torch.exp2(torch.ceil(torch.log2(a / E4M3_MAX)))
    assert torch.equal(s.double(), expected)


def test_fp32_scale_uses_the_full_range():
    amax = torch.tensor([1.0, 448.0, 3.3e-3, 1234.5])
    s, inv = scales_from_amax(amax, "fp32")
    assert torch.allclose(s, amax / 448.0, rtol=0, atol=0)
    x = torch.zeros(4, GROUP)
    x[:, 0] = amax
    q, _ = quantize_1x128(x, "fp32")
    assert torch.equal(q[:, 0].float(), torch.full((4,), 448.0))


def test_unknown_scale_format_is_rejected():
    with pytest.raises(ValueError, match="scale_format"):
        scales_from_amax(torch.ones(2), "e5m2")
    with pytest.raises(ValueError):
        Fp8Recipe(scale_format="int8")


# ---------------------------------------------------------------------------------- 1x128 activations


@pytest.mark.parametrize("cols", [256, 200, 128 * 3 + 1])
def test_1x128_shapes_bounds_and_pow2_scales(cols):
    x = _spread(64, cols, seed=cols)
    q, s = quantize_1x128(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (64, math.ceil(cols / GROUP))
    assert float(q.float().abs().max()) <= E4M3_MAX
    assert _is_pow2(s)
    # each group's largest value lands in (224, 448]: the scale is the smallest that fits
    xpad = F.pad(x, (0, s.shape[1] * GROUP - cols)).reshape(64, -1, GROUP)
    group_max = (xpad.abs().amax(-1) / s)
    assert bool(((group_max > 224) & (group_max <= 448)).all())


def test_1x128_dequantization_error_bound_for_normal_values():
    x = _spread(128, 1024, seed=1)
    q, s = quantize_1x128(x)
    xd = dequantize_1x128(q, s)
    scaled = (x / s.repeat_interleave(GROUP, 1)).abs()
    normal = scaled >= E4M3_MIN_NORMAL
    assert normal.float().mean() > 0.95
    rel = ((xd - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2.0**-4
    # subnormal values keep an absolute error of at most half the subnormal step (2**-10 * s)
    sub_err = ((xd - x).abs() / s.repeat_interleave(GROUP, 1))[~normal]
    assert float(torch.cat([sub_err, torch.zeros(1)]).max()) <= 2.0**-10


def test_1x128_groups_are_independent_and_along_the_last_dim():
    x = _spread(4, 512, seed=2)
    _, s0 = quantize_1x128(x)
    y = x.clone()
    y[1, 130] = 1e3 * x[1].abs().max()  # group 1 of row 1 only
    _, s1 = quantize_1x128(y)
    changed = (s0 != s1).nonzero().tolist()
    assert changed == [[1, 1]]


def test_zero_groups_quantize_to_zero_with_a_finite_scale():
    x = torch.zeros(3, 256)
    x[0, :128] = 1.0
    q, s = quantize_1x128(x)
    assert torch.isfinite(s).all() and bool((s > 0).all())
    assert torch.equal(q[1:].float(), torch.zeros(2, 256))
    assert torch.equal(dequantize_1x128(q, s), x)


def test_quantization_is_deterministic():
    x = _spread(96, 384, seed=3).to(torch.bfloat16)
    a = quantize_1x128(x)
    b = quantize_1x128(x.clone())
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------------------------- 128x128 weights


@pytest.mark.parametrize("shape", [(256, 384), (200, 130)])
def test_128x128_blocks(shape):
    n, k = shape
    w = torch.randn(n, k) * torch.exp2(torch.randint(-8, 9, (1, k)).float())
    q, s = quantize_128x128(w)
    assert q.shape == w.shape and s.shape == (math.ceil(n / GROUP), math.ceil(k / GROUP))
    assert _is_pow2(s) and float(q.float().abs().max()) <= E4M3_MAX
    # one scale per block: it is the pow2 scale of that block's amax
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            block = w[bi * GROUP:(bi + 1) * GROUP, bj * GROUP:(bj + 1) * GROUP]
            expected, _ = scales_from_amax(block.abs().max().reshape(1))
            assert float(s[bi, bj]) == float(expected)
    wd = dequantize_128x128(q, s)
    scaled = (w / s.repeat_interleave(GROUP, 0).repeat_interleave(GROUP, 1)[:n, :k]).abs()
    normal = scaled >= E4M3_MIN_NORMAL
    assert float(((wd - w).abs() / w.abs())[normal].max()) <= 2.0**-4


def test_128x128_of_the_transpose_is_the_transpose():
    w = torch.randn(384, 256)
    q, s = quantize_128x128(w)
    qt, st = quantize_128x128(w.t())
    assert torch.equal(qt.view(torch.uint8), q.t().contiguous().view(torch.uint8))
    assert torch.equal(st, s.t())


# ---------------------------------------------------------------------------------- GEMMs


def _ref_operands(m=256, k=384, n=512, seed=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / math.sqrt(k)
    dy = torch.randn(m, n, generator=g)
    return x, w, dy


def test_emulated_gemms_equal_float64_products_of_the_quantized_operands():
    x, w, dy = _ref_operands()
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w)
    dyq, dys = quantize_1x128(dy)
    xd, wd, dyd = dequantize_1x128(xq, xs).double(), dequantize_128x128(wq, ws).double(), dequantize_1x128(dyq, dys).double()
    y = emulated_fprop(xq, xs, wq, ws)
    assert torch.allclose(y.double(), xd @ wd.t(), rtol=1e-5, atol=1e-5)
    dx = emulated_dgrad(dyq, dys, wq, ws)
    assert torch.allclose(dx.double(), dyd @ wd, rtol=1e-5, atol=1e-5)
    dytq, dyts = quantize_1x128(dy.t())
    xtq, xts = quantize_1x128(x.t())
    dw = emulated_wgrad(dytq, dyts, xtq, xts)
    ref = dequantize_1x128(dytq, dyts).double() @ dequantize_1x128(xtq, xts).double().t()
    assert torch.allclose(dw.double(), ref, rtol=1e-5, atol=1e-4)


def _relerr(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def test_fp8_linear_forward_error_against_fp32():
    x, w, _ = _ref_operands()
    y = fp8_linear(x, w)
    ref = x @ w.t()
    err = _relerr(y, ref)
    assert 1e-3 < err < 0.05, err  # FP8 noise is there (not a silent fp32 path) but bounded


def test_fp8_linear_gradients_match_autograd_of_the_emulation():
    """dx and dw equal the products of the quantized operands the recipe prescribes (dy per 1x128
    along N for Dgrad; dy and x per 1x128 along the tokens for Wgrad), and stay close to fp32."""
    x, w, dy = _ref_operands()
    x = x.requires_grad_()
    w = w.clone().requires_grad_()
    y = fp8_linear(x, w)
    y.backward(dy)
    # the emulation written as a differentiable float64 graph: y = Q(x) Q(w)^T with the gradient
    # quantized on its way back (what an FP8 backward does)
    wq, ws = quantize_128x128(w.detach())
    dyq, dys = quantize_1x128(dy)
    dytq, dyts = quantize_1x128(dy.t())
    xtq, xts = quantize_1x128(x.detach().t())
    dx_ref = dequantize_1x128(dyq, dys).double() @ dequantize_128x128(wq, ws).double()
    dw_ref = dequantize_1x128(dytq, dyts).double() @ dequantize_1x128(xtq, xts).double().t()
    assert torch.allclose(x.grad.double(), dx_ref, rtol=1e-5, atol=1e-5)
    assert torch.allclose(w.grad.double(), dw_ref, rtol=1e-5, atol=1e-4)
    # and against plain fp32 autograd
    x32, w32 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x32 @ w32.t()).backward(dy)
    assert _relerr(x.grad, x32.grad) < 0.06
    assert _relerr(w.grad, w32.grad) < 0.06


def test_fp8_linear_handles_3d_inputs_bias_and_ragged_shapes():
    torch.manual_seed(5)
    lin = nn.Linear(200, 130, bias=True)
    fl = Fp8Linear.from_linear(lin)
    x = torch.randn(3, 37, 200, requires_grad=True)
    y = fl(x)
    assert y.shape == (3, 37, 130)
    y.square().mean().backward()
    assert x.grad.shape == x.shape and lin.weight.grad.shape == lin.weight.shape
    assert lin.bias.grad is not None
    ref = lin(x.detach())
    assert _relerr(y.detach(), ref) < 0.05


def test_only_fp8_tensors_are_saved_for_backward():
    """Puro §3.2: the quantized input (not the BF16 one) is retained for Wgrad."""
    x, w, _ = _ref_operands()
    x = x.to(torch.bfloat16).requires_grad_()
    w = w.requires_grad_()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fp8_linear(x, w)
    big = [t for t in saved if t.numel() >= x.numel() // 2]
    assert big, "nothing large saved?"
    assert all(t.dtype == torch.float8_e4m3fn for t in big), [t.dtype for t in big]


def test_autocast_gives_bf16_output_and_master_dtype_gradients():
    x, w, _ = _ref_operands()
    x = x.requires_grad_()
    w = w.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8_linear(x, w)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32


def test_no_grad_forward_matches_training_forward():
    x, w, _ = _ref_operands()
    with torch.no_grad():
        y0 = fp8_linear(x, w)
    y1 = fp8_linear(x.requires_grad_(), w.requires_grad_())
    assert torch.equal(y0, y1.detach())


def test_fp32_scale_format_runs_and_is_at_least_as_accurate():
    x, w, _ = _ref_operands(seed=6)
    ref = x @ w.t()
    e_pow2 = _relerr(fp8_linear(x, w, recipe=Fp8Recipe(scale_format="pow2")), ref)
    e_fp32 = _relerr(fp8_linear(x, w, recipe=Fp8Recipe(scale_format="fp32")), ref)
    assert e_fp32 < 0.05 and e_fp32 <= e_pow2 * 1.1


def test_cuda_backend_on_cpu_tensors_is_refused():
    x, w, _ = _ref_operands()
    with pytest.raises(RuntimeError, match="CUDA"):
        fp8_linear(x, w, recipe=Fp8Recipe(backend="cuda-scaled-mm"))


# ---------------------------------------------------------------------------------- converter


class _Block(nn.Module):
    """A Qwen3-style block (the real model lives in trainer/model.py; this one keeps the test
    independent of it)."""

    def __init__(self, d: int, d_ff: int, n_heads: int, n_kv: int):
        super().__init__()
        hd = d // n_heads
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, hd
        self.attn_norm = nn.RMSNorm(d)
        self.q_proj = nn.Linear(d, n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, n_kv * hd, bias=False)
        self.v_proj = nn.Linear(d, n_kv * hd, bias=False)
        self.o_proj = nn.Linear(n_heads * hd, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d)
        self.gate_proj = nn.Linear(d, d_ff, bias=False)
        self.up_proj = nn.Linear(d, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(b, s, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.n_kv, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, s, -1))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class _TinyLM(nn.Module):
    def __init__(self, vocab=512, d=128, d_ff=256, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([_Block(d, d_ff, 4, 2) for _ in range(layers)])
        self.norm = nn.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


def test_converter_swaps_exactly_the_block_linears_and_keeps_parameters():
    torch.manual_seed(0)
    model = _TinyLM()
    before = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())
    out = convert_to_fp8(model, None)
    assert out is model
    names = fp8_module_names(model)
    expected = [f"layers.{i}.{p}_proj" for i in range(2) for p in ("q", "k", "v", "o", "gate", "up", "down")]
    assert sorted(names) == sorted(expected)
    assert type(model.lm_head) is nn.Linear and type(model.embed_tokens) is nn.Embedding
    assert list(model.state_dict()) == keys
    after = dict(model.named_parameters())
    assert all(after[n] is p for n, p in before.items()), "parameters must be shared, not copied"


def test_converted_model_trains_and_stays_close_to_the_high_precision_model():
    torch.manual_seed(0)
    ref = _TinyLM()
    model = _TinyLM()
    model.load_state_dict(ref.state_dict())
    convert_to_fp8(model, Fp8Recipe())
    ids = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _relerr(model(ids), ref(ids)) < 0.05
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 512), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0] - 1.0, losses


def test_converter_accepts_recipes_mappings_and_run_configs():
    class RunCfg:
        precision = "fp8-blockwise"
        fp8 = {"scale_format": "fp32"}

    class PlainRunCfg:
        precision = "fp8-blockwise"

    class Bf16RunCfg:
        precision = "bf16"

    assert resolve_recipe(None) == Fp8Recipe()
    assert resolve_recipe({"scale_format": "fp32"}).scale_format == "fp32"
    assert resolve_recipe(RunCfg()).scale_format == "fp32"
    assert resolve_recipe(PlainRunCfg()) == Fp8Recipe()
    with pytest.raises(ValueError, match="bf16"):
        resolve_recipe(Bf16RunCfg())
    with pytest.raises(TypeError):
        resolve_recipe(42)
    model = _TinyLM(layers=1)
    convert_to_fp8(model, RunCfg())
    assert model.layers[0].q_proj.recipe.scale_format == "fp32"


def test_converter_include_exclude_and_nothing_to_convert():
    model = _TinyLM(layers=1)
    convert_to_fp8(model, Fp8Recipe(include=r"(gate|up|down)_proj$"))
    assert sorted(n.rsplit(".", 1)[1] for n in fp8_module_names(model)) == ["down_proj", "gate_proj", "up_proj"]
    with pytest.raises(ValueError, match="no nn.Linear"):
        convert_to_fp8(nn.Sequential(nn.Embedding(4, 4)), None)
    with pytest.raises(ValueError):
        Fp8Recipe(exclude=["("])


def test_converted_model_is_deterministic():
    def run():
        torch.manual_seed(3)
        model = convert_to_fp8(_TinyLM(layers=1), None)
        ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(2))
        loss = F.cross_entropy(model(ids).reshape(-1, 512), ids.reshape(-1))
        loss.backward()
        return loss.detach(), model.layers[0].q_proj.weight.grad.clone()

    (l1, g1), (l2, g2) = run(), run()
    assert torch.equal(l1, l2) and torch.equal(g1, g2)


def test_trainer_model_converts_its_block_linears_only():
    """The trainer's Qwen3-style model: every block linear converts, embedding/LM head/norms do not,
    and a forward/backward runs through the emulation."""
    model_mod = pytest.importorskip("trainer.model")
    cfg = model_mod.preset_config("tiny", vocab_size=1000)
    model = model_mod.build_model(cfg, seed=0)
    keys = list(model.state_dict())
    convert_to_fp8(model, None)
    names = fp8_module_names(model)
    assert len(names) == 7 * cfg.n_layers
    assert {n.rsplit(".", 1)[1] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert type(model.lm_head) is nn.Linear and list(model.state_dict()) == keys
    tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    F.cross_entropy(logits.reshape(-1, 1000), tokens.reshape(-1)).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_fp8_siblings_share_one_input_quantization_and_equal_separate_layers():
    """q, k, v in FP8 through `stacked_linears`: one 1x128 quantization of the shared input, and,
    since every sibling's width is a multiple of 128, the same quantized operands as three separate
    Fp8Linears, so outputs and gradients agree to float32 summation order."""
    from trainer.fp8 import stacked_linears

    g = torch.Generator().manual_seed(1)
    layers = tuple(Fp8Linear(256, n, bias=False, recipe=Fp8Recipe(backend="emulate")) for n in (256, 128, 128))
    for m in layers:
        m.weight.data = torch.randn(m.weight.shape, generator=g) * 0.05
    x = _spread(192, 256, seed=2).requires_grad_(True)

    def run(fn):
        for m in layers:
            m.zero_grad()
        x.grad = None
        ys = fn()
        sum((y * (i + 1)).sum() for i, y in enumerate(ys)).backward()
        return [y.detach() for y in ys], [m.weight.grad.clone() for m in layers] + [x.grad.clone()]

    fused_y, fused_g = run(lambda: stacked_linears(x, layers))
    sep_y, sep_g = run(lambda: tuple(m(x) for m in layers))
    for a, b in zip(fused_y + fused_g, sep_y + sep_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_fused_fp8_swiglu_mlp_equals_the_linears_one_by_one():
    """The MLP whose down projection is an Fp8Linear runs as one fused FP8 computation (SwiGLU inside
    the quantizations); with the emulation it quantizes exactly the operands that the gate-up sibling
    linear and a separate down projection quantize, so output and every gradient agree to float32
    summation order. Without gradients (inference) it gives the same output."""
    from trainer.fp8 import stacked_linears
    from trainer.model import MLP, ModelConfig

    cfg = ModelConfig(vocab_size=10, d_model=256, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=128, d_ff=384)
    mlp = MLP(cfg)
    g = torch.Generator().manual_seed(3)
    for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        m.weight.data = torch.randn(m.weight.shape, generator=g) * 0.05
    convert_to_fp8(mlp, Fp8Recipe(backend="emulate"))
    x = _spread(192, 256, seed=4).requires_grad_(True)
    dy = torch.randn(192, 256, generator=g)
    layers = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)

    def unfused():
        gate, up = stacked_linears(x, layers[:2])
        return mlp.down_proj(F.silu(gate) * up)

    def run(fn):
        for m in layers:
            m.zero_grad()
        x.grad = None
        y = fn()
        (y * dy).sum().backward()
        return [y.detach()] + [m.weight.grad.clone() for m in layers] + [x.grad.clone()]

    calls = []
    original = type(mlp.down_proj).forward_swiglu
    def spy(self, *a):
        calls.append(1)
        return original(self, *a)
    type(mlp.down_proj).forward_swiglu = spy
    try:
        fused = run(lambda: mlp(x))
    finally:
        type(mlp.down_proj).forward_swiglu = original
    assert calls, "the MLP did not take the fused path"
    ref = run(unfused)
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), ref[0], rtol=1e-5, atol=1e-5 * ref[0].abs().max().item())


def test_gemm_table_lookup_exact_then_nearest_token_count_then_none():
    """The per-shape GEMM choice: the measured shape, else the same weight shape at the nearest token
    count (M of Fprop, K of Wgrad), else none (cuBLAS); a recipe that asks for cuBLAS never consults it."""
    from trainer.fp8.gemm import CUBLAS, GemmChoice, choose_gemm, table_entry

    table = {"GPU X": {
        "fprop": {
            "32768x4096x2048": {"library": "cutlass", "config": "pingpong_64x256"},
            "8192x4096x2048": {"library": "cublas"},
            "32768x2048x2048": {"library": "cutlass", "config": "coop_128x128", "raster": "n", "swizzle": 2},
        },
        "wgrad": {"4096x2048x32768": {"library": "cutlass", "config": "coop_256x128"}},
    }}
    assert table_entry("GPU X", "fprop", 32768, 4096, 2048, table) == GemmChoice("cutlass", "pingpong_64x256")
    assert table_entry("GPU X", "fprop", 16384, 2048, 2048, table) == GemmChoice("cutlass", "coop_128x128", "n", 2)
    assert table_entry("GPU X", "fprop", 4096, 4096, 2048, table) == CUBLAS          # nearest M: 8192
    assert table_entry("GPU X", "wgrad", 4096, 2048, 16384, table) == GemmChoice("cutlass", "coop_256x128")
    assert table_entry("GPU X", "wgrad", 2048, 2048, 32768, table) is None
    assert table_entry("GPU X", "fprop", 32768, 4096, 1024, table) is None
    # Dgrad is the same GEMM as Fprop: an exact Fprop row serves it, but not a nearest-count one
    assert table_entry("GPU X", "dgrad", 32768, 4096, 2048, table) == GemmChoice("cutlass", "pingpong_64x256")
    assert table_entry("GPU X", "dgrad", 16384, 4096, 2048, table) is None
    assert table_entry("GPU Y", "fprop", 32768, 4096, 2048, table) is None
    assert choose_gemm("fprop", 32768, 4096, 2048, "cublas", torch.device("cpu")) == CUBLAS
    # no usable CUTLASS library here (no CUDA): auto falls back to cuBLAS, a forced cutlass says why
    assert choose_gemm("fprop", 32768, 4096, 2048, "auto", torch.device("cpu")) == CUBLAS
    with pytest.raises(RuntimeError, match="fp8 gemm 'cutlass' is not usable here"):
        choose_gemm("wgrad", 2048, 2048, 32768, "cutlass", torch.device("cpu"))


def test_a_table_config_the_build_lacks_falls_back_to_cublas(monkeypatch):
    """A measured table may name a DeepGEMM config; a library built without $DEEPGEMM_DIR lacks it, and
    the choice is then cuBLAS (with a warning), never a failing call."""
    from trainer.fp8 import cutlass_gemm, gemm

    table = {"GPU X": {"fprop": {
        "32768x4096x2048": {"library": "cutlass", "config": "deepgemm_256x128_c1x1_n4096_k2048"},
        "32768x2048x2048": {"library": "cutlass", "config": "coop_256x128_c1x1"},
    }}}
    monkeypatch.setattr(gemm, "_table", lambda path=gemm.GEMM_TABLE: table)
    monkeypatch.setattr(gemm, "_CHOICES", {})
    monkeypatch.setattr(cutlass_gemm, "available", lambda device=None: (True, "test"))
    monkeypatch.setattr(cutlass_gemm, "configs", lambda kind, n=None, k=None: ["coop_256x128_c1x1"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU X")
    dev = torch.device("cuda", 0)
    assert gemm.choose_gemm("fprop", 32768, 4096, 2048, "auto", dev) == gemm.CUBLAS
    assert gemm.choose_gemm("fprop", 32768, 2048, 2048, "auto", dev) == gemm.GemmChoice("cutlass", "coop_256x128_c1x1")


def test_bf16_wgrad_on_an_fp32_table_config_is_the_rounded_fp32_result(monkeypatch):
    """The table names act_act (fp32-output) configs; a BF16 weight's Wgrad through one must run it in fp32
    and round (the act_act_bf16 kind has only its own configs), and take that kind where it has the config."""
    from types import SimpleNamespace

    from trainer.fp8 import cutlass_gemm

    calls = []

    def act_act_call(a, b, sa, sb, c, d, beta, kind, config, raster, swizzle):
        calls.append((config, kind, d.dtype))
        d.fill_(1.0 + 2**-10)

    lib = SimpleNamespace(configs={"act_act": {"coop_256x128_c2x1": 6, "coop_128x128_c1x1": 5},
                                   "act_act_bf16": {"coop_128x128_c1x1": 11}})
    monkeypatch.setattr(cutlass_gemm, "library", lambda: (lib, "test"))
    monkeypatch.setattr(cutlass_gemm, "_act_act_call", act_act_call)
    a, b = torch.zeros(256, 128), torch.zeros(384, 128)
    s_a, s_b = torch.ones(256, 1), torch.ones(384, 1)
    y = cutlass_gemm.act_act(a, b, s_a, s_b, "coop_256x128_c2x1", out_dtype=torch.bfloat16)
    assert calls == [("coop_256x128_c2x1", "act_act", torch.float32)]
    assert y.dtype == torch.bfloat16 and y.shape == (256, 384) and torch.all(y == 1.0)  # 1 + 2^-10 rounds to 1
    assert cutlass_gemm.act_act(a, b, s_a, s_b, "coop_128x128_c1x1", out_dtype=torch.bfloat16).dtype == torch.bfloat16
    assert calls[-1] == ("coop_128x128_c1x1", "act_act_bf16", torch.bfloat16)
    assert cutlass_gemm.act_act(a, b, s_a, s_b, "coop_256x128_c2x1").dtype == torch.float32
    assert calls[-1] == ("coop_256x128_c2x1", "act_act", torch.float32)


def test_quantized_copies_are_row_major_even_for_transposed_inputs():
    """cuBLAS needs the FP8 A operand row-major; quantizing x.t() (Wgrad) must not return a view."""
    x = torch.randn(256, 384, dtype=torch.bfloat16)
    q, s = quantize_1x128(x.t())
    assert q.is_contiguous() and q.shape == (384, 256)
    ref, _ = quantize_1x128(x.t().contiguous())
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))
    qw, _ = quantize_128x128(torch.randn(256, 384).t())
    assert qw.is_contiguous()


def test_readme_example_and_idempotent_conversion():
    from trainer.flops import QWEN3_SHAPES, flops_per_token

    model = _TinyLM(layers=1)
    convert_to_fp8(model, None)
    convert_to_fp8(model, Fp8Recipe(scale_format="fp32"))  # already converted: a no-op
    assert len(fp8_module_names(model)) == 7
    assert round(flops_per_token(QWEN3_SHAPES["1.7b"], 4096).fp8_share(), 3) == 0.721


def test_step_weights_quantize_each_stack_once_a_step_and_change_nothing(monkeypatch):
    """`step_weights` over the trainer model's `weight_stacks`: two micro-batches inside one step give the
    same losses and gradients, bit for bit, as quantizing every weight at every use; each stack (q|k|v,
    o, gate|up, down) is quantized once for the step instead of once a micro-batch; the copies are gone
    after the step (and are never in the state dict), also when the step raises."""
    from trainer.fp8 import quantize as fp8_quantize_mod
    from trainer.fp8 import step_weights
    from trainer.fp8 import stacked_weight, weight_stacks
    from trainer.model import build_model, preset_config

    cfg = preset_config("tiny", vocab_size=512)
    model = convert_to_fp8(build_model(cfg, seed=0), Fp8Recipe(backend="emulate"))
    keys = set(model.state_dict())
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 512, (2, 64), generator=gen) for _ in range(2)]
    quantized = []
    real = fp8_quantize_mod.quantize_128x128   # what the emulation's quantization op runs
    monkeypatch.setattr(fp8_quantize_mod, "quantize_128x128", lambda w, f: quantized.append(tuple(w.shape)) or real(w, f))

    def step(ctx):
        model.zero_grad()
        quantized.clear()
        with ctx:
            losses = []
            for ids in batches:
                loss = F.cross_entropy(model(ids).reshape(-1, 512), ids.reshape(-1))
                loss.backward()
                losses.append(loss.detach())
        return losses, [p.grad.clone() for p in model.parameters()], list(quantized)

    ref_losses, ref_grads, per_use = step(contextlib.nullcontext())
    losses, grads, once = step(step_weights(weight_stacks(model), stacked_weight))
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses))
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    d, kv, ff = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.d_ff
    stack_shapes = [(cfg.n_heads * cfg.head_dim + 2 * kv, d), (d, cfg.n_heads * cfg.head_dim), (2 * ff, d), (d, ff)]
    assert sorted(once) == sorted(stack_shapes * cfg.n_layers)          # once a step
    assert sorted(per_use) == sorted(stack_shapes * cfg.n_layers * 2)   # before: once a micro-batch
    fp8 = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    assert all(m.step_q is None for m in fp8) and set(model.state_dict()) == keys
    with pytest.raises(RuntimeError, match="boom"):
        with step_weights(weight_stacks(model), stacked_weight) as n:
            assert n == 4 * cfg.n_layers and model.model.layers[0].self_attn.q_proj.step_q is not None
            raise RuntimeError("boom")
    assert all(m.step_q is None for m in fp8)


def test_step_weights_add_the_wgrads_into_one_buffer_a_stack_bit_for_bit():
    """`step_weights(grads=True)`: each stack's Wgrads of a step's micro-batches are added into one float32
    buffer (the GEMM's accumulate, here the emulation's) instead of being returned to autograd; each weight's
    `.grad` is then its rows of the buffer: the same bits as autograd's accumulation, eager and in blocks
    traced as the loop compiles them (the buffer is an input the compiled backward mutates). A gradient something else left on a weight is added to; a
    step that raises assigns nothing."""
    from trainer.fp8 import step_weights
    from trainer.fp8 import stacked_weight, weight_stacks
    from trainer.model import build_model, preset_config

    torch._dynamo.reset()
    cfg = preset_config("tiny", vocab_size=512)
    model = convert_to_fp8(build_model(cfg, seed=0), Fp8Recipe(backend="emulate"))
    gen = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, 512, (2, 64), generator=gen) for _ in range(3)]

    def step(ctx):
        model.zero_grad(set_to_none=True)
        with ctx:
            for ids in batches:
                F.cross_entropy(model(ids).reshape(-1, 512), ids.reshape(-1)).backward()
        return [p.grad.clone() for p in model.parameters()]

    ref = step(step_weights(weight_stacks(model), stacked_weight))
    got = step(step_weights(weight_stacks(model), stacked_weight, grads=True))
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    # AOTAutograd (what traces the loop's compiled blocks) with the buffer as an input its backward mutates;
    # aot_eager, so that the comparison is bit for bit (Inductor reorders the float32 arithmetic around the
    # FP8 ops; the compiled loop test below and tests/trainer/test_fp8_gpu.py compile with it)
    for block in model.model.layers:
        block.compile(backend="aot_eager")
    compiled = step(step_weights(weight_stacks(model), stacked_weight, grads=True))
    assert all(torch.equal(a, b) for a, b in zip(compiled, ref))
    q = model.model.layers[0].self_attn.q_proj
    assert q.step_grad is None and q.weight.grad.data_ptr() == q._grad_buffer.data_ptr()   # a view, not a copy
    again = step(step_weights(weight_stacks(model), stacked_weight, grads=True))           # zeroed on entry
    assert all(torch.equal(a, b) for a, b in zip(again, ref))
    # zero_grad(set_to_none=False) keeps the views as .grad: the next step neither keeps nor doubles them
    model.zero_grad(set_to_none=False)
    with step_weights(weight_stacks(model), stacked_weight, grads=True):
        for ids in batches:
            F.cross_entropy(model(ids).reshape(-1, 512), ids.reshape(-1)).backward()
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), ref))
    # a gradient already on a weight is added to
    model.zero_grad(set_to_none=True)
    down = model.model.layers[0].mlp.down_proj
    down.weight.grad = torch.ones_like(down.weight)
    with step_weights(weight_stacks(model), stacked_weight, grads=True):
        for ids in batches:
            F.cross_entropy(model(ids).reshape(-1, 512), ids.reshape(-1)).backward()
    i = [n for n, _ in model.named_parameters()].index("model.layers.0.mlp.down_proj.weight")
    assert torch.equal(down.weight.grad, ref[i] + 1)
    # a frozen sibling in a stack gets no gradient from the buffer
    model.zero_grad(set_to_none=True)
    k = model.model.layers[0].self_attn.k_proj
    k.weight.requires_grad_(False)
    with step_weights(weight_stacks(model), stacked_weight, grads=True):
        F.cross_entropy(model(batches[0]).reshape(-1, 512), batches[0].reshape(-1)).backward()
    assert k.weight.grad is None and q.weight.grad is not None
    k.weight.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match="boom"):
        with step_weights(weight_stacks(model), stacked_weight, grads=True):
            F.cross_entropy(model(batches[0]).reshape(-1, 512), batches[0].reshape(-1)).backward()
            raise RuntimeError("boom")
    assert q.weight.grad is None and q.step_grad is None


def test_a_step_copy_is_used_only_for_a_weight_of_its_shape():
    """A layer whose step copy holds a stack computes its own weight alone as if it had none."""
    layer = Fp8Linear(256, 128, bias=False, recipe=Fp8Recipe(backend="emulate"))
    other = Fp8Linear(256, 128, bias=False, recipe=Fp8Recipe(backend="emulate"))
    x = _spread(64, 256, seed=6)
    layer.set_step_weight(torch.cat([layer.weight, other.weight]))
    assert layer.step_weight(layer.weight)[0] is None
    torch.testing.assert_close(layer(x), fp8_linear(x, layer.weight, recipe=layer.recipe), rtol=0, atol=0)
    layer.clear_step_weight()


def test_the_compiled_loop_trains_the_emulated_fp8_preset_on_cpu(tmp_path):
    """`python -m trainer train` with `compile: true` and FP8 on CPU, on the `tiny` preset whose dimensions are
    not multiples of 128 (so the emulation pads its groups): Inductor compiles the blocks around the emulation's
    quantizations and GEMMs (opaque ops: its CPU code generation failed on them, then gave NaN losses once the
    Wgrads went into the step's buffers), and the losses are the uncompiled run's to float32 reordering."""
    import json

    from trainer.config import load_run_config
    from trainer.train import train

    def run(compiled: bool) -> list[float]:
        run_dir = tmp_path / ("compiled" if compiled else "eager")
        train(load_run_config(None, data={
            "run_dir": str(run_dir), "precision": "fp8-blockwise", "compile": compiled,
            "model": {"preset": "tiny"}, "data": {"synthetic": {"vocab_size": 512, "seq_len": 128}},
            "train": {"steps": 3, "global_batch": 4, "micro_batch": 2},
            "schedule": {"kind": "constant", "lr": 3e-3, "warmup_steps": 1},
            "checkpoint": {"every_steps": 0, "at_end": False}, "log": {"progress": "none"}}))
        recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in recs if r["kind"] == "train"]

    torch._dynamo.reset()
    compiled, eager = run(True), run(False)
    assert len(compiled) == 3 and all(math.isfinite(x) for x in compiled)
    assert compiled == pytest.approx(eager, rel=1e-3)


def test_an_op_defined_by_trainer_fp8_ops_dispatches_mutates_and_compiles_whole():
    """`trainer.fp8.ops.op` (what every op of the package is defined with): the schema inferred from the annotations
    marks the written argument, a call dispatches through torch.ops to the function, and a graph that calls the op
    compiles whole (the fake gives the shapes) and mutates the argument as eager does."""
    from trainer.fp8.ops import Op, op

    @op("test_scaled_add_into", mutates_args=("out",))
    def scaled_add_into(x: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        out.add_(x * scale)

    @op("test_double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    fakes = []

    @double.register_fake
    def _(x):
        fakes.append(x.shape)
        return torch.empty_like(x)

    @scaled_add_into.register_fake
    def _(x, scale, out):
        return None

    assert isinstance(double, Op) and double.impl(torch.ones(2)).tolist() == [2.0, 2.0]
    schema = str(torch.ops.purokit_fp8.test_scaled_add_into.default._schema)
    assert "Tensor(a2!) out" in schema and "float scale" in schema, schema
    x, out = torch.arange(4.0), torch.zeros(4)
    scaled_add_into(x, 0.5, out)
    assert out.tolist() == [0.0, 0.5, 1.0, 1.5]

    def step(x, out):
        scaled_add_into(double(x), 1.0, out)
        return out.sum()

    compiled_out = torch.zeros(4)
    total = torch.compile(step, backend="aot_eager", fullgraph=True)(x, compiled_out)
    assert compiled_out.tolist() == [0.0, 2.0, 4.0, 6.0] and total.item() == 12.0
    assert fakes, "tracing used the fake"


def test_stacked_linears_run_fp8_siblings_as_one_linear_over_the_stacked_weights():
    """FP8 siblings (an Fp8Linear computing in float64 here, to compare exactly) get ONE call with the stacked weights
    and bias; the split outputs and the gradients into the separate parameters equal the linears
    run one by one. Plain nn.Linears and mixed classes run one by one."""
    calls = []

    from trainer.fp8 import stacked_linears

    class WeightLinear(Fp8Linear):
        def forward_weight(self, x, weight, bias=None):
            calls.append(tuple(weight.shape))
            return torch.nn.functional.linear(x, weight, bias)

    g = torch.Generator().manual_seed(0)
    linears = tuple(WeightLinear(32, n, bias=True).double() for n in (64, 16, 16))
    for m in linears:
        for p in m.parameters():
            p.data = torch.randn(p.shape, generator=g, dtype=torch.float64)
    x = torch.randn(3, 5, 32, generator=g, dtype=torch.float64, requires_grad=True)

    def run(fn):
        for m in linears:
            m.zero_grad()
        x.grad = None
        ys = fn()
        sum((y * (i + 1)).sum() for i, y in enumerate(ys)).backward()
        return [y.detach() for y in ys], [p.grad.clone() for m in linears for p in m.parameters()] + [x.grad.clone()]

    fused_y, fused_g = run(lambda: stacked_linears(x, linears))
    assert calls == [(96, 32)]
    ref_y, ref_g = run(lambda: tuple(torch.nn.functional.linear(x, m.weight, m.bias) for m in linears))
    assert [y.shape for y in fused_y] == [(3, 5, 64), (3, 5, 16), (3, 5, 16)]
    for a, b in zip(fused_y + fused_g, ref_y + ref_g):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    calls.clear()
    plain = torch.nn.Linear(32, 8).double()
    stacked_linears(x, (linears[0], plain))              # mixed classes: one by one
    stacked_linears(x, (plain, torch.nn.Linear(32, 8).double()))  # plain linears: one by one
    assert calls == [(64, 32)]                           # the FP8 one on its own weight alone: neither stacked
