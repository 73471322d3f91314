"""MuonH and friends: routing (behaviour 20), Hyperball invariant (21), normalized step and measured
effective LR (22), LR multiplier (23), Newton-Schulz, Eq. 3 and Eq. 5, optimizer placement (32)."""

import math

import pytest
import torch

from trainer.model import ModelConfig, build_model, preset_config
from tests.trainer.placement import place_greedy, place_zigzag, placement_loads, water_fill
from trainer.optim import (MATRIX_ROLES, NS_COEFFS, MatrixOptimizer, OptimConfig, build_optimizer,
                           elr_aligned_update, gram_iterations, hyperball_update, muon_update, nesterov_momentum_,
                           newton_schulz, ns_dtype_for, param_role, route_params)

TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, max_seq_len=32)


def _train_steps(model, opt, n_steps, lr_base=1e-2, seed=0):
    """A few steps of next-token training on random tokens; yields after each step."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n_steps):
        x = torch.randint(0, model.cfg.vocab_size, (4, 17), generator=gen)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.set_lr(lr_base)
        opt.step()
        yield loss.item()


def test_routing_matrices_to_muonh_everything_else_to_adamw():
    model = build_model(ModelConfig(**TINY), seed=0)
    routed = route_params(model.named_parameters())
    assert set(routed) == set(MATRIX_ROLES) | {"embed", "lm_head", "norm"}
    norm_names = {n for n, _ in routed["norm"]}
    assert "model.layers.0.self_attn.q_norm.weight" in norm_names      # QK-norm is AdamW
    assert "model.layers.1.self_attn.k_norm.weight" in norm_names
    assert "model.norm.weight" in norm_names and "model.layers.0.input_layernorm.weight" in norm_names
    assert [n for n, _ in routed["embed"]] == ["model.embed_tokens.weight"]
    assert [n for n, _ in routed["lm_head"]] == ["lm_head.weight"]
    opt = build_optimizer(model, OptimConfig())
    matrix_params = {id(p) for g in opt.optimizers["matrix"].param_groups for p in g["params"]}
    adam_params = {id(p) for g in opt.optimizers["adamw"].param_groups for p in g["params"]}
    assert not matrix_params & adam_params
    assert matrix_params | adam_params == {id(p) for p in model.parameters()}
    for name, p in model.named_parameters():
        assert (id(p) in matrix_params) == (param_role(name) in MATRIX_ROLES), name
    # DDP / compile prefixes do not change the routing
    assert param_role("module._orig_mod.model.layers.3.mlp.down_proj.weight") == "down_proj"


def test_newton_schulz_orthogonalizes_and_batches():
    g = torch.Generator().manual_seed(0)
    G = torch.randn(3, 24, 40, generator=g)
    X = newton_schulz(G, steps=5)
    s = torch.linalg.svdvals(X)
    assert s.min() > 0.6 and s.max() < 1.25          # the quintic's band around 1 (Keller Jordan's Muon)
    for i in range(3):                                 # a batch equals its members one by one
        torch.testing.assert_close(X[i], newton_schulz(G[i], steps=5), rtol=1e-5, atol=1e-6)
    tall = newton_schulz(G.mT.contiguous(), steps=5)  # tall matrices are handled by transposing
    torch.testing.assert_close(tall, X.mT, rtol=1e-5, atol=1e-6)
    exact = torch.linalg.svd(G, full_matrices=False)
    polar = exact.U @ exact.Vh                         # the orthogonal polar factor NS approximates
    cos = (X * polar).sum(dim=(-2, -1)) / (X.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert cos.min() > 0.98


def _relerr(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _spectra(seed: int = 0) -> dict[str, torch.Tensor]:
    """Stacks of wide momentum-like matrices: full rank, rank 8, and a spectrum decaying over four decades."""
    g = torch.Generator().manual_seed(seed)
    return {"full": torch.randn(4, 128, 384, generator=g),
            "rank8": torch.randn(4, 128, 8, generator=g) @ torch.randn(4, 8, 384, generator=g),
            "decaying": torch.randn(4, 128, 384, generator=g) * torch.logspace(0, -4, 384)}


@pytest.mark.parametrize("shape", [(48, 144), (144, 48), (3, 64, 256), (3, 256, 64), (2, 64, 96), (2, 64, 64)],
                         ids=["wide", "tall", "batched-wide", "batched-tall", "aspect-1.5", "square"])
def test_the_gram_form_is_the_standard_iteration_in_fp32(shape):
    """The Gram form computes the same five quintic iterates (a polynomial of the Gram matrix times X): in
    float32 it equals the standard form to float32 rounding on wide, tall and batched stacks."""
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    standard, gram = newton_schulz(G, dtype=torch.float32), newton_schulz(G, dtype=torch.float32, form="gram")
    exact = newton_schulz(G.double(), dtype=torch.float64)
    assert gram.dtype == G.dtype and gram.shape == G.shape
    assert _relerr(gram, standard) < 1e-5 and _relerr(gram, exact) < 1e-5


def test_the_gram_form_in_its_cuda_dtype_is_as_accurate_as_the_standard_form_in_bf16():
    """On CUDA the standard form runs in bfloat16 and the Gram form, by default, in float16 (ns_dtype_for): on
    every spectrum the Gram form is then within 1.3x of the standard form's error against float64, while in
    bfloat16 it loses a decaying spectrum's small singular values (> 3x the error): why auto picks float16.
    Its restart matters: without it a rank-deficient stack loses more, and diverges in bfloat16."""
    cuda = torch.device("cuda")
    assert ns_dtype_for("auto", "standard", cuda) == torch.bfloat16
    assert ns_dtype_for("auto", "gram", cuda) == torch.float16
    assert ns_dtype_for("auto", "gram", torch.device("cpu")) == torch.float32 == ns_dtype_for("float32", "gram", cuda)
    for name, G in _spectra().items():
        exact = newton_schulz(G.double(), dtype=torch.float64)
        standard = _relerr(newton_schulz(G, dtype=torch.bfloat16), exact)
        gram = _relerr(newton_schulz(G, dtype=torch.float16, form="gram"), exact)
        assert gram <= 1.3 * standard, (name, gram, standard)
        if name == "decaying":
            assert _relerr(newton_schulz(G, dtype=torch.bfloat16, form="gram"), exact) > 3 * standard
        if name == "rank8":  # the restart halves the float16 error and keeps bfloat16 from diverging (11x)
            for dtype, factor in ((torch.float16, 2), (torch.bfloat16, 20)):
                X = (G / G.norm(dim=(-2, -1), keepdim=True)).to(dtype)
                with_restart = _relerr(gram_iterations(X, 5, NS_COEFFS), exact)
                assert _relerr(gram_iterations(X, 5, NS_COEFFS, restarts=()), exact) > factor * with_restart


def test_muonh_with_the_gram_form_takes_the_same_steps():
    """`optim.ns_form: gram` reaches the optimizer through the config and MuonH's steps equal the standard
    form's (fp32 on the CPU) on a model with square, wide and tall matrices; an unknown form is refused."""
    runs = {}
    for form in ("standard", "gram"):
        model = build_model(ModelConfig(**TINY), seed=0)
        opt = build_optimizer(model, OptimConfig(ns_form=form))
        assert opt.optimizers["matrix"].ns_form == form
        runs[form] = (list(_train_steps(model, opt, 3)), {n: p.detach() for n, p in model.named_parameters()})
    assert runs["gram"][0] == pytest.approx(runs["standard"][0], rel=1e-5)
    for name, p in runs["gram"][1].items():
        torch.testing.assert_close(p, runs["standard"][1][name], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="unknown Newton-Schulz form"):
        MatrixOptimizer([{"params": [torch.nn.Parameter(torch.ones(4, 8))], "name": "x"}], ns_form="polar")


def test_nesterov_momentum_matches_the_recurrence():
    buf = torch.zeros(2, 3)
    g1, g2 = torch.ones(2, 3), 2 * torch.ones(2, 3)
    out1 = nesterov_momentum_(buf, g1, 0.9)
    torch.testing.assert_close(buf, 0.1 * g1)
    torch.testing.assert_close(out1, 0.1 * g1 + 0.9 * buf)
    nesterov_momentum_(buf, g2, 0.9)
    torch.testing.assert_close(buf, 0.9 * 0.1 * g1 + 0.1 * g2)


def test_nesterov_momentum_on_lists_equals_the_stack_form():
    """The optimizer steps the momentum buffers in place as a list (foreach); same numbers as a stack."""
    g = torch.Generator().manual_seed(3)
    bufs, grads = [torch.randn(4, 5, generator=g) for _ in range(3)], [torch.randn(4, 5, generator=g) for _ in range(3)]
    stack = torch.stack(bufs)
    for nesterov in (True, False):
        want = nesterov_momentum_(stack, torch.stack(grads), 0.95, nesterov)
        got = nesterov_momentum_(bufs, grads, 0.95, nesterov)
        torch.testing.assert_close(torch.stack(got), want)
        torch.testing.assert_close(torch.stack(bufs), stack)


def test_groups_with_different_rates_in_one_shape_bucket():
    """Matrices of one shape from groups at different learning rates share one Newton-Schulz stack;
    each still moves at its own group's rate (MuonH: measured rho = eta)."""
    g = torch.Generator().manual_seed(4)
    a, b = (torch.nn.Parameter(torch.randn(6, 4, generator=g)) for _ in range(2))
    opt = MatrixOptimizer([dict(params=[a], name="fast", lr=0.2), dict(params=[b], name="slow", lr=0.01)])
    radius = [a.detach().norm().item(), b.detach().norm().item()]
    a.grad, b.grad = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    opt.step()
    assert opt.last_effective_lr["fast"][0] == pytest.approx(0.2, rel=1e-5)
    assert opt.last_effective_lr["slow"][0] == pytest.approx(0.01, rel=1e-5)
    assert [a.detach().norm().item(), b.detach().norm().item()] == pytest.approx(radius, rel=1e-6)


def test_hyperball_update_is_eq1():
    g = torch.Generator().manual_seed(1)
    W, u = torch.randn(1, 8, 6, generator=g, dtype=torch.float64), torch.randn(1, 8, 6, generator=g, dtype=torch.float64)
    R = torch.tensor(3.0, dtype=torch.float64)
    eta = 0.05
    W_new, disp = hyperball_update(W, u, eta, R)
    u_hat = u / u.norm()
    W_tilde = W - eta * R * u_hat
    torch.testing.assert_close(W_new, R * W_tilde / W_tilde.norm())
    assert math.isclose(disp.norm().item(), eta * 3.0, rel_tol=1e-12)


def test_muon_and_elr_updates_are_eq3_and_eq5():
    g = torch.Generator().manual_seed(2)
    W, u = torch.randn(1, 5, 7, generator=g, dtype=torch.float64), torch.randn(1, 5, 7, generator=g, dtype=torch.float64)
    W_new, disp = muon_update(W, u, 0.1, 0.5)
    torch.testing.assert_close(W_new, (1 - 0.05) * W - 0.1 * u)
    rho = 0.02
    W_elr, disp = elr_aligned_update(W, u, rho, 0.0)
    eta = rho * W.norm() / u.norm()
    torch.testing.assert_close(W_elr, W - eta * u)
    assert math.isclose((disp.norm() / W.norm()).item(), rho, rel_tol=1e-12)


def test_hyperball_invariant_and_measured_effective_lr_in_fp32():
    """Behaviours 21-23: after every step ||W_t|| = ||W_0|| (rel. err <= 1e-6 in fp32); the
    pre-projection displacement has norm eta R, so the measured rho equals the MuonH rate, which is
    m x base; AdamW groups run at the base rate."""
    model = build_model(ModelConfig(**TINY), seed=0)
    opt = build_optimizer(model, OptimConfig(matrix="muonh", matrix_lr_mult=10.0))
    matrices = {n: p for n, p in model.named_parameters() if param_role(n) in MATRIX_ROLES}
    radius = {n: p.detach().norm().item() for n, p in matrices.items()}
    before = {n: p.detach().clone() for n, p in matrices.items()}
    lr_base = 1e-2
    for i, _ in enumerate(_train_steps(model, opt, 6, lr_base)):
        for n, p in matrices.items():
            assert abs(p.detach().norm().item() / radius[n] - 1) <= 1e-6, (i, n)
        for g in opt.param_groups:
            expect = 10 * lr_base if g["name"].startswith("muonh/") else lr_base
            assert g["lr"] == pytest.approx(expect, rel=1e-12), g["name"]
        elr = opt.effective_lr
        assert set(elr) == {f"muonh/{r}" for r in MATRIX_ROLES}
        for name, rhos in elr.items():
            for rho in rhos:
                assert rho == pytest.approx(10 * lr_base, rel=1e-6), name
    assert all(not torch.equal(before[n], p) for n, p in matrices.items())     # they did move


def test_lr_multiplier_is_configurable():
    model = build_model(ModelConfig(**TINY), seed=0)
    opt = build_optimizer(model, OptimConfig(matrix_lr_mult=4.0))
    lrs = opt.set_lr(3e-4)
    assert lrs["muonh/q_proj"] == pytest.approx(1.2e-3) and lrs["adamw/embed"] == pytest.approx(3e-4)


def test_muon_and_elr_muon_train_and_elr_matches_the_target():
    for rule in ("muon", "muon_elr"):
        model = build_model(ModelConfig(**TINY), seed=0)
        opt = build_optimizer(model, OptimConfig(matrix=rule, matrix_lr_mult=10.0, muon_weight_decay=0.1))
        losses = list(_train_steps(model, opt, 4, 1e-2))
        assert all(math.isfinite(x) for x in losses)
        if rule == "muon_elr":
            for rhos in opt.effective_lr.values():
                assert all(r == pytest.approx(0.1, rel=1e-5) for r in rhos)


def test_adamw_baseline_routes_everything_to_adamw():
    model = build_model(ModelConfig(**TINY), seed=0)
    opt = build_optimizer(model, OptimConfig(matrix="adamw"))
    assert list(opt.optimizers) == ["adamw"]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_muonh_refuses_zero_matrices_and_keeps_radius_in_state():
    model = build_model(ModelConfig(**TINY), seed=0)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.zero_()
    with pytest.raises(ValueError, match="non-zero"):
        build_optimizer(model, OptimConfig())
    model = build_model(ModelConfig(**TINY), seed=0)
    opt = build_optimizer(model, OptimConfig())
    list(_train_steps(model, opt, 2))
    state = opt.state_dict()
    radii = [s["radius"] for s in state["matrix"]["state"].values()]
    assert len(radii) == 7 * 2 and all(r > 0 for r in radii)
    # a fresh optimizer that loads the state continues with the saved radius and momentum
    opt2 = build_optimizer(model, OptimConfig())
    opt2.load_state_dict(state)
    with pytest.raises(ValueError, match="optimizer.matrix"):
        build_optimizer(model, OptimConfig(matrix="adamw")).load_state_dict(state)


def test_greedy_placement_beats_zigzag_on_the_production_tensor_list():
    """Puro §3.1.3 / behaviour 32: intact Muon tensors bin-packed by size, flattened Adam tensors
    filling the rest, against the layer-wise zigzag baseline (1.7B, DP = 12 and 24)."""
    model = build_model(preset_config("1.7b"), device="meta")
    muon, adam, layers = [], [], []
    for name, p in model.named_parameters():
        (muon if param_role(name) in MATRIX_ROLES else adam).append(p.numel())
    for i, layer in enumerate(model.model.layers):
        size = sum(p.numel() for p in layer.parameters())
        if i == 0:
            size += model.model.embed_tokens.weight.numel()
        if i == len(model.model.layers) - 1:
            size += model.lm_head.weight.numel() + model.model.norm.weight.numel()
        layers.append(size)
    for n_ranks in (12, 24):
        placement = place_greedy(muon, adam, n_ranks)
        loads = placement_loads(placement)
        assert sum(loads) == sum(muon) + sum(adam)                      # nothing lost or duplicated
        muon_seen = sorted(i for rank in placement for kind, i, _ in rank if kind == "muon")
        assert muon_seen == list(range(len(muon)))                      # every Muon tensor intact, once
        zig = place_zigzag(layers, n_ranks)
        assert max(loads) / min(loads) < max(zig) / min(zig)
        assert max(loads) / min(loads) < 1.01


def test_water_fill_levels_the_lowest_ranks():
    assert water_fill([10, 0, 5], 9) == [0, 7, 2]
    assert sum(water_fill([3, 3, 3], 7)) == 7
    assert water_fill([0, 100], 10) == [10, 0]


def test_the_bucket_step_compiles_whole_and_equals_eager():
    """`bucket_step_` under torch.compile (what one CUDA process runs): no graph break, the eager step's
    matrices and rho, and one graph whatever the learning rate (it is passed as a tensor)."""
    import functools

    from torch._dynamo.utils import counters

    from trainer.optim import bucket_step_, newton_schulz

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(bucket_step_, dynamic=False)
    ns = functools.partial(newton_schulz, steps=5, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    W_e = [torch.randn(16, 32, generator=gen) for _ in range(3)]
    W_c = [w.clone() for w in W_e]
    bufs_e, bufs_c = [torch.zeros(16, 32) for _ in range(3)], [torch.zeros(16, 32) for _ in range(3)]
    radius = torch.stack([w.norm() for w in W_e]).view(-1, 1, 1)
    for step in range(3):
        grads = [torch.randn(16, 32, generator=gen) for _ in range(3)]
        lr = torch.tensor(0.01 * (step + 1))
        kw = dict(rule="muonh", momentum=0.95, nesterov=True, scale=1.0, orthogonalize=ns)
        _, rho_e = bucket_step_(W_e, bufs_e, grads, lr, 0.0, radius, write_to=W_e, **kw)
        _, rho_c = compiled(W_c, bufs_c, grads, lr, 0.0, radius, write_to=W_c, **kw)
        for a, b in zip(W_e, W_c):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rho_c, rho_e)
        torch.testing.assert_close(rho_c, torch.full((3,), 0.01 * (step + 1)), rtol=1e-4, atol=0)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
