"""Blockwise FP8 on CUDA: the fused quantizers (Triton, and the CUDA kernels of csrc/quantize.cu)
bit-exact against the torch reference, cuBLAS GEMMs against the emulation, torch.compile. Marked `gpu`;
skipped cleanly without CUDA (`make test-gpu`)."""

from __future__ import annotations

import contextlib
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.fp8 import Fp8Linear, Fp8Recipe, convert_to_fp8, fp8_linear, probe_scaled_mm, quantize_1x128, quantize_128x128
from trainer.fp8 import cutlass_gemm
from trainer.fp8.gemm import emulated_dgrad, emulated_fprop, emulated_wgrad
from trainer.fp8.triton_kernels import quant_act, quant_weight, swiglu_bwd_quant, swiglu_quant, triton_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


needs_triton = pytest.mark.skipif(not triton_available(), reason="needs Triton")
needs_blockwise = pytest.mark.skipif(not _hopper(), reason="blockwise cuBLAS FP8 needs SM90+")
_CUDA_QUANT, _CUDA_QUANT_WHY = cutlass_gemm.available() if torch.cuda.is_available() else (False, "needs CUDA")
IMPLS = ["triton", pytest.param("cuda", marks=pytest.mark.skipif(not _CUDA_QUANT, reason=_CUDA_QUANT_WHY))]


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _spread(m: int, k: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    mag = torch.exp2(torch.randint(-12, 13, (m, 1), device="cuda", generator=g).float())
    col = torch.exp2(torch.randint(-4, 5, (1, k), device="cuda", generator=g).float())
    return (torch.randn(m, k, device="cuda", generator=g) * mag * col).to(dtype)


def _same_bytes(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    if a.dtype == torch.float8_e4m3fn:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    bad = (a != b)
    if bool(bad.any()):
        idx = bad.nonzero()[:3].tolist()
        raise AssertionError(f"{name}: {int(bad.sum())}/{bad.numel()} elements differ, first at {idx}: "
                             f"{[a[tuple(i)].item() for i in idx]} vs {[b[tuple(i)].item() for i in idx]}")


@needs_triton
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", [4096, 1000, 128])
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_act_quant_is_bit_exact(impl, m, scale_format, dtype):
    if impl == "cuda" and dtype != torch.bfloat16:
        pytest.skip("the CUDA quantizers take BF16 activations")
    k = 768
    x = _spread(m, k, seed=m, dtype=dtype)
    if impl == "cuda":  # rows further apart than K (a column slice of a wider tensor), read in place
        wide = torch.zeros(m, k + 256, device="cuda", dtype=dtype)
        wide[:, 128:128 + k] = x
        x = wide[:, 128:128 + k]
        assert x.stride() == (k + 256, 1)
    pow2 = scale_format == "pow2"
    q, s, qt, st = quant_act(x, pow2, True, True, impl=impl)
    rq, rs = quantize_1x128(x, scale_format)
    _same_bytes("scale", s, rs)
    _same_bytes("q", q, rq)
    assert s.stride() == (1, m)  # column-major, as scaled_mm wants
    m_pad = -(-m // 128) * 128
    rqt, rst = quantize_1x128(F.pad(x, (0, 0, 0, m_pad - m)).t(), scale_format)
    _same_bytes("transposed scale", st, rst)
    _same_bytes("transposed q", qt, rqt)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
def test_triton_weight_quant_is_bit_exact(dtype, scale_format):
    w = _spread(1024, 640, seed=7, dtype=dtype)
    q, qt, s = quant_weight(w, scale_format == "pow2", True)
    rq, rs = quantize_128x128(w, scale_format)
    _same_bytes("scale", s, rs)
    _same_bytes("q", q, rq)
    _same_bytes("transposed q", qt, rq.t().contiguous())


@needs_blockwise
def test_probe_finds_blockwise_scaled_mm():
    caps = probe_scaled_mm("cuda")
    assert caps.blockwise, caps.reason


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@needs_blockwise
@pytest.mark.parametrize("mkn", [(4096, 2048, 6144), (4096, 6144, 2048), (1000, 1024, 384)])
def test_cublas_gemms_match_the_emulation(mkn):
    from trainer.fp8 import gemm

    m, k, n = mkn
    caps = probe_scaled_mm("cuda")
    x = _spread(m, k, seed=1)
    w = (torch.randn(n, k, device="cuda") / k**0.5)
    dy = _spread(m, n, seed=2)
    xq, xs = quantize_1x128(x)
    wq, ws = quantize_128x128(w)
    dyq, dys = quantize_1x128(dy)
    y = gemm.scaled_mm_fprop(xq, xs, wq, ws, caps)
    assert _rel(y, emulated_fprop(xq, xs, wq, ws, torch.float64)) < 5e-3
    dx = gemm.scaled_mm_dgrad(dyq, dys, wq.t().contiguous(), ws, caps)
    assert _rel(dx, emulated_dgrad(dyq, dys, wq, ws, torch.float64)) < 5e-3
    m_pad = -(-m // 128) * 128
    dytq, dyts = quantize_1x128(F.pad(dy, (0, 0, 0, m_pad - m)).t())
    xtq, xts = quantize_1x128(F.pad(x, (0, 0, 0, m_pad - m)).t())
    dw = gemm.scaled_mm_wgrad(dytq, dyts, xtq, xts, caps)
    assert _rel(dw, emulated_wgrad(dytq, dyts, xtq, xts, torch.float64)) < 5e-3


@needs_blockwise
@pytest.mark.parametrize("quantizer", ["torch", "triton"])
def test_fp8_linear_on_cuda_matches_the_emulation_forward_and_backward(quantizer):
    if quantizer == "triton" and not triton_available():
        pytest.skip("needs Triton")
    torch.manual_seed(0)
    x = _spread(2 * 1000, 1024, seed=3).view(2, 1000, 1024).requires_grad_()
    w = (torch.randn(3072, 1024, device="cuda") * 0.02).requires_grad_()
    dy = _spread(2000, 3072, seed=4).view(2, 1000, 3072)
    y = fp8_linear(x, w, recipe=Fp8Recipe(backend="cuda-scaled-mm", quantizer=quantizer))
    y.backward(dy)
    xe, we = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ye = fp8_linear(xe, we, recipe=Fp8Recipe(backend="emulate"))
    ye.backward(dy)
    assert y.dtype == torch.bfloat16
    assert _rel(y, ye) < 1e-2
    assert _rel(x.grad, xe.grad) < 1e-2
    assert _rel(w.grad, we.grad) < 1e-2
    assert w.grad.dtype == torch.float32


@needs_blockwise
@needs_triton
def test_triton_and_torch_quantizers_give_identical_layers():
    x = _spread(4096, 2048, seed=5).requires_grad_()
    w = (torch.randn(2048, 2048, device="cuda") * 0.02).requires_grad_()
    dy = _spread(4096, 2048, seed=6)
    grads = []
    for quantizer in ("torch", "triton"):
        xi, wi = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        y = fp8_linear(xi, wi, recipe=Fp8Recipe(backend="cuda-scaled-mm", quantizer=quantizer))
        y.backward(dy)
        grads.append((y.detach(), xi.grad, wi.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def _nearly_same_quantization(name, got, x, pow2):
    """``got`` = (q, s, qt, st) is :func:`quant_act` of ``x`` up to the last bits of float32 math (the
    fused kernels' fast sigmoid against torch's): power-of-two scales equal but for <= 0.1% of groups
    (float32 scales within 2e-6), FP8 codes equal but for <= 0.1% of values, and where they differ,
    a neighbouring code of the same sign."""
    for part, a, b in zip(("q", "scale", "transposed q", "transposed scale"), got, quant_act(x, pow2, True, True)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {part}"
        if a.dtype == torch.float8_e4m3fn:
            diff = (a.view(torch.uint8).int() - b.view(torch.uint8).int()).abs()
            assert int(diff.max()) <= 1, f"{name}: {part} differs by {int(diff.max())} codes"
            frac = float((diff > 0).float().mean())
        elif pow2:
            frac = float((a != b).float().mean())
        else:  # fp32 scales (amax / 448) follow the last bit of each group's amax
            torch.testing.assert_close(a, b, rtol=2e-6, atol=0, msg=f"{name}: {part}")
            frac = 0.0
        assert frac <= 1e-3, f"{name}: {part}: {frac:.2e} of the values differ"


@needs_triton
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("m", [4096, 1000])
@pytest.mark.parametrize("scale_format", ["pow2", "fp32"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_swiglu_quant_equals_float32_torch_then_quant(impl, m, scale_format, direction):
    """The fused kernels quantize what float32 torch computes from the BF16 gate-up output: h = silu(gate)
    * up (forward), and its autograd d[gate | up] given dh (backward; rows-only gives the same row copy)."""
    f = 768
    gu = _spread(m, 2 * f, seed=m + 1)
    g32 = gu.float().requires_grad_()
    gate, up = g32.chunk(2, dim=-1)
    h = F.silu(gate) * up
    pow2 = scale_format == "pow2"
    if direction == "forward":
        _nearly_same_quantization("swiglu", swiglu_quant(gu, pow2, True, impl=impl), h.detach(), pow2)
        return
    dh = _spread(m, f, seed=m + 3)
    h.backward(dh.float())
    got = swiglu_bwd_quant(gu, dh, pow2, True, True, impl=impl)
    _nearly_same_quantization("swiglu backward", got, g32.grad, pow2)
    rows_only = swiglu_bwd_quant(gu, dh, pow2, True, False, impl=impl)
    _same_bytes("rows only: q", rows_only[0], got[0])
    assert rows_only[2].numel() == 0


@needs_blockwise
@needs_triton
def test_fused_fp8_swiglu_mlp_triton_matches_torch_quantizer_and_tracks_bf16():
    """The fused MLP (`Fp8Linear.forward_swiglu`) on cuBLAS: the Triton kernels agree with the torch
    quantizer path (the same float32 formulas; fast sigmoid) and the FP8 MLP tracks BF16 to FP8 noise."""
    from trainer.model import MLP, ModelConfig

    cfg = ModelConfig(vocab_size=10, d_model=2048, n_layers=1, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144)
    torch.manual_seed(0)
    base = MLP(cfg).cuda()
    x = (torch.randn(4096, 2048, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(4096, 2048, device="cuda").to(torch.bfloat16)
    results = {}
    names = ("bf16", "torch", "triton") + (("cuda",) if _CUDA_QUANT else ())
    for name in names:
        mlp = MLP(cfg).cuda()
        mlp.load_state_dict(base.state_dict())
        if name != "bf16":
            convert_to_fp8(mlp, Fp8Recipe(backend="cuda-scaled-mm", quantizer=name))
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = mlp(xi)
        y.backward(dy)
        results[name] = [y.detach(), xi.grad] + [m.weight.grad for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
    for a, b in zip(results["triton"], results["torch"]):
        assert _rel(a, b) < 5e-3
    for a, b in zip(results["triton"], results["bf16"]):
        assert _rel(a, b) < 0.1
    if "cuda" in results:  # the CUDA kernels: the same quantization up to the fast sigmoid's last bits
        for a, b in zip(results["cuda"], results["triton"]):
            assert _rel(a, b) < 5e-3


class _Tiny(nn.Module):
    def __init__(self, d=512, ff=1536, vocab=1024, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(norm=nn.RMSNorm(d), up_proj=nn.Linear(d, ff, bias=False),
                               gate_proj=nn.Linear(d, ff, bias=False), down_proj=nn.Linear(ff, d, bias=False)))
            for _ in range(layers)
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            h = b["norm"](x)
            x = x + b["down_proj"](F.silu(b["gate_proj"](h)) * b["up_proj"](h))
        return self.lm_head(x)


@needs_blockwise
def test_torch_compile_of_a_converted_model_matches_eager():
    torch.manual_seed(0)
    model = _Tiny().cuda()
    convert_to_fp8(model, Fp8Recipe(backend="cuda-scaled-mm"))
    ids = torch.randint(0, 1024, (4, 512), device="cuda")

    def loss_of(m):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(ids)
        return F.cross_entropy(logits.float().reshape(-1, 1024), ids.reshape(-1))

    eager = loss_of(model)
    eager.backward()
    g_eager = model.blocks[0]["up_proj"].weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(model)
    loss_c = loss_of(compiled)
    loss_c.backward()
    g_c = model.blocks[0]["up_proj"].weight.grad
    assert abs(loss_c.item() - eager.item()) < 1e-2
    # Inductor fuses the norm/SiLU around the linears, so FP8 roundings of their outputs flip here and
    # there: compiled and eager gradients agree to FP8 noise (measured 0.059 on the H200), not bitwise
    assert _rel(g_c, g_eager) < 0.15


@needs_blockwise
def test_converted_trainer_model_runs_on_cuda():
    model_mod = pytest.importorskip("trainer.model")
    cfg = model_mod.preset_config("150m", vocab_size=4096)
    model = model_mod.build_model(cfg, seed=0, device="cuda")
    convert_to_fp8(model, None)
    ids = torch.randint(0, 4096, (2, 1024), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().reshape(-1, 4096), ids.reshape(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert isinstance(model.model.layers[0].self_attn.q_proj, Fp8Linear)


@needs_blockwise
@needs_triton
def test_step_weights_in_compiled_blocks_give_the_same_step():
    """Blocks compiled as the loop compiles them: a step of two micro-batches with the weights quantized
    once (`step_weights`) gives the losses and gradients of quantizing them at every use (to FP8 rounding
    flips; bit for bit with the emulation, tests/trainer/test_fp8.py), and the blocks compile once for each
    (every block shares the graph; the step copies are buffers, inputs to it)."""

    from trainer.fp8 import step_weights
    from trainer.fp8 import stacked_weight, weight_stacks
    from trainer.model import ModelConfig, build_model

    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]   # reset() keeps the counters
    cfg = ModelConfig(vocab_size=1024, d_model=256, n_layers=3, n_heads=2, n_kv_heads=1, head_dim=128, d_ff=512)
    model = convert_to_fp8(build_model(cfg, seed=0, device="cuda"), Fp8Recipe(backend="cuda-scaled-mm"))
    for block in model.model.layers:
        block.compile()
    gen = torch.Generator(device="cuda").manual_seed(0)
    batches = [torch.randint(0, 1024, (2, 256), device="cuda", generator=gen) for _ in range(2)]

    def step(ctx):
        model.zero_grad()
        with ctx:
            losses = []
            for ids in batches:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(ids)
                loss = F.cross_entropy(logits.float().reshape(-1, 1024), ids.reshape(-1))
                loss.backward()
                losses.append(loss.detach())
        return torch.stack(losses), [p.grad.clone() for p in model.parameters()]

    ref_losses, ref_grads = step(contextlib.nullcontext())
    losses, grads = step(step_weights(weight_stacks(model), stacked_weight))
    again, _ = step(step_weights(weight_stacks(model), stacked_weight))
    # the two graphs quantize the same weights, but Inductor schedules the ops around the (now absent) weight
    # quantization differently, so a BF16 rounding and then an FP8 code flip here and there: the H200 gave a
    # 2.3e-5 relative loss difference on the second micro-batch (stale or misassembled weights move it > 1e-2)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=0)
    assert torch.equal(again, losses)          # the same graph and copies again: the same bits
    worst = max(_rel(a, b) for a, b in zip(grads, ref_grads))
    assert worst < 0.05, f"gradients differ by {worst:.3g} (relative norm)"
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
    assert graphs == 2, f"{graphs} graphs compiled for 3 blocks in two modes (without and with step copies)"
    # the Wgrads added into one fp32 buffer a stack (the buffer an input the compiled backward mutates): the
    # step's losses, and its gradients summed in the same order
    into, into_grads = step(step_weights(weight_stacks(model), stacked_weight, grads=True))
    torch.testing.assert_close(into, losses, rtol=1e-4, atol=0)
    worst = max(_rel(a, b) for a, b in zip(into_grads, grads))
    assert worst < 1e-2, f"gradients added into the buffers differ by {worst:.3g} (relative norm)"
