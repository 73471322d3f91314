"""MuonH (Puro §3.3, Eq. 1), plain Muon with decoupled weight decay (Eq. 3), effective-LR-aligned
Muon (Eq. 5), and the AdamW that takes everything else.

Symbols follow the paper: W the matrix, R = ||W_0||_F its fixed radius, u the Muon update
(Newton-Schulz orthogonalized Nesterov momentum), u_hat = u / ||u||_F, eta the learning rate,
rho = eta ||u||_F / ||W||_F the effective learning rate (Eq. 4).

Routing (behaviour 20): q, k, v, o, gate, up and down projections go to the matrix optimizer;
embeddings, the LM head, every RMSNorm gain (QK-norm included) and anything else go to AdamW.
The matrix groups run at m times the base learning rate (m = 10 in Puro), AdamW groups at the base.

Newton-Schulz runs batched over all matrices of the same shape (one `baddbmm` chain per shape), in one of
two forms of the same iteration (`ns_form`): `standard` multiplies the (m, n) matrix every step; `gram`
(Zhang, Amsel, Chen and Dao 2026, "Gram Newton-Schulz", as dion and DeepSpeed ship it) iterates on the
(m, m) Gram matrix of a non-square one and multiplies the (m, n) matrix only at a restart and at the end,
fewer FLOPs where n > ~2m (the MLP matrices). Which runs faster on the GPU is not measured yet; `standard`
stays the default. Under data parallelism each rank orthogonalizes a contiguous share of every shape's stack and the
results are all-gathered (as in modded-nanogpt), so the work is split, not repeated. Under FSDP2 the
matrices are row shards (DTensors): the step gathers each full gradient and matrix (Newton-Schulz and
the hyperball norm need whole matrices), splits the Newton-Schulz work over the ranks as above, and
writes back each rank's rows; the momentum buffers stay full matrices on every rank.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Any, Iterable

import torch
import torch.distributed as dist
from pydantic import Field

from purokit.config import StrictModel

NS_COEFFS = (3.4445, -4.7750, 2.0315)     # quintic Newton-Schulz (Keller Jordan's Muon)
NS_FORMS = ("standard", "gram")
# the Gram form's restarts: before these iterations X is rebuilt from the accumulated polynomial and the Gram
# matrix recomputed from it, which removes the drift a low-precision (bf16) Gram matrix gathers (Dao et al.'s
# default: one restart, before the third of five iterations)
GRAM_RESTARTS = (2,)
MATRIX_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class OptimConfig(StrictModel):
    """Optimizer settings. Puro gives the routing, Eq. 1 and m = 10; the rest are the common
    Muon/AdamW defaults (spec §5.3: not in the seed) and are recorded with every run."""

    matrix: str = Field("muonh", pattern="^(muonh|muon|muon_elr|adamw)$")   # rule for q,k,v,o,gate,up,down
    matrix_lr_mult: float = 10.0          # m: eta^H = m * eta^base (Puro §3.3)
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    ns_coeffs: tuple[float, float, float] = NS_COEFFS
    # auto: on CUDA bf16 (standard form) or fp16 (gram: its Gram-matrix products need fp16's 10 mantissa bits,
    # Dao et al.'s choice; in bf16 its error on a decaying spectrum is ~9x the standard form's), fp32 on CPU
    ns_dtype: str = Field("auto", pattern="^(auto|float32|bfloat16|float16)$")
    ns_form: str = Field("standard", pattern="^(standard|gram)$")   # the Gram form of the same iteration
    muon_weight_decay: float = 0.1        # decoupled, Eq. 3 (plain Muon and ELR-aligned Muon only)
    muon_scale: str = Field("shape", pattern="^(shape|none)$")   # plain Muon: sqrt(max(1, rows/cols)) (Keller)
    adam_betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    adam_weight_decay: float = 0.1        # embeddings and LM head; norms and 1-D params get none
    grad_clip: float | None = 1.0         # global L2 norm clip before the step (None: off)
    distribute_ns: bool = True            # split Newton-Schulz across data-parallel ranks


# --------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------

def param_role(name: str) -> str:
    """The role of a parameter: one of MATRIX_ROLES, or 'embed', 'lm_head', 'norm', 'other'."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in MATRIX_ROLES:
        return parts[-2]
    if "embed_tokens" in parts:
        return "embed"
    if parts[0] == "lm_head" or "lm_head" in parts:
        return "lm_head"
    if any(p.endswith("norm") or p.endswith("layernorm") for p in parts[:-1]):
        return "norm"
    return "other"


def route_params(named: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Split parameters by role (behaviour 20). Returns role -> [(name, param)], in model order."""
    out: dict[str, list] = defaultdict(list)
    for name, p in named:
        if p.requires_grad:
            out[param_role(name.removeprefix("module.").removeprefix("_orig_mod."))].append((name, p))
    return dict(out)


def is_matrix_role(role: str) -> bool:
    return role in MATRIX_ROLES


# --------------------------------------------------------------------------------------------
# The equations, one function each
# --------------------------------------------------------------------------------------------

def nesterov_momentum_(buf, grad, beta: float, nesterov: bool = True):
    """buf <- beta buf + (1 - beta) g; returns the Nesterov look-ahead (1 - beta) g + beta buf
    (or a copy of buf without Nesterov). Works on stacks, and on lists of tensors (foreach kernels)."""
    if isinstance(buf, (list, tuple)):
        torch._foreach_lerp_(buf, grad, 1 - beta)
        return torch._foreach_lerp(grad, buf, beta) if nesterov else [b.clone() for b in buf]
    buf.lerp_(grad, 1 - beta)
    return grad.lerp(buf, beta) if nesterov else buf.clone()


def newton_schulz(G: torch.Tensor, steps: int = 5, coeffs: tuple[float, float, float] = NS_COEFFS,
                  dtype: torch.dtype = torch.float32, eps: float = 1e-7, form: str = "standard") -> torch.Tensor:
    """Approximate the orthogonal polar factor U V^T of G = U S V^T with the quintic iteration
    X <- a X + (b A + c A^2) X, A = X X^T, after scaling X to unit Frobenius norm.

    G: (..., m, n), batched over leading dims. Works on the wide orientation (m <= n) so that A is
    the smaller Gram matrix. ``form="gram"`` computes the same iterates through :func:`gram_iterations`
    (a square matrix keeps the standard form: the Gram form saves nothing there). Returns a tensor of G's dtype.
    """
    a, b, c = coeffs
    X = G.to(dtype)
    transposed = X.size(-2) > X.size(-1)
    if transposed:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    if form == "gram" and X.size(-2) < X.size(-1):
        X = gram_iterations(X, steps, coeffs)
    else:
        for _ in range(steps):
            A = X @ X.mT
            B = torch.baddbmm(A, A, A, beta=b, alpha=c) if A.ndim == 3 else b * A + c * (A @ A)
            X = torch.baddbmm(X, B, X, beta=a, alpha=1.0) if X.ndim == 3 else a * X + B @ X
    if transposed:
        X = X.mT
    return X.to(G.dtype)


def gram_iterations(X: torch.Tensor, steps: int, coeffs: tuple[float, float, float],
                    restarts: tuple[int, ...] = GRAM_RESTARTS) -> torch.Tensor:
    """The quintic iteration on a wide (..., m, n) X, m < n, in its Gram form: each step's polynomial
    P = a I + b R + c R^2 of R = X X^T is a polynomial of R, so X_t = Q X_0 with Q = P_1 ... P_t, and the next
    Gram matrix is P R P. Only (m, m) products run in the loop; X is multiplied at a restart (``restarts``:
    X <- Q X, R recomputed from it) and once at the end."""
    a, b, c = coeffs
    shape = X.shape
    X = X.reshape(-1, *shape[-2:])
    eye = torch.eye(shape[-2], dtype=X.dtype, device=X.device).expand(X.shape[0], -1, -1)
    R, Q = X @ X.mT, None
    for i in range(steps):
        if Q is not None and i in restarts:
            X = Q @ X
            R, Q = X @ X.mT, None
        Z = torch.baddbmm(R, R, R, beta=b, alpha=c)                 # P - a I
        Q = Z + a * eye if Q is None else torch.baddbmm(Q, Q, Z, beta=a)
        if i + 1 < steps and i + 1 not in restarts:
            RP = torch.baddbmm(R, R, Z, beta=a)                     # R P
            R = torch.baddbmm(RP, Z, RP, beta=a)                    # P R P
    return (Q @ X).reshape(shape)


def ns_dtype_for(setting: str, form: str, device: torch.device) -> torch.dtype:
    """The dtype Newton-Schulz runs in: ``setting`` (OptimConfig.ns_dtype); ``auto`` is float32 off CUDA and on
    CUDA bfloat16 for the standard form, float16 for the Gram form (whose products of the Gram matrix lose the
    small singular values in bfloat16's 8-bit mantissa: tests/trainer/test_optim.py measures it)."""
    if setting != "auto":
        return getattr(torch, setting)
    if device.type != "cuda":
        return torch.float32
    return torch.float16 if form == "gram" else torch.bfloat16


def frobenius(x: torch.Tensor) -> torch.Tensor:
    """Per-matrix Frobenius norm of a stack (..., m, n) -> (..., 1, 1)."""
    return x.norm(dim=(-2, -1), keepdim=True)


def hyperball_update(W: torch.Tensor, u: torch.Tensor, eta: float, R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Puro Eq. 1. u_hat = u/||u||; W~ = W - eta R u_hat; W' = R W~/||W~||.

    Returns (W', displacement W~ - W). Its norm is eta R, so rho = eta R / ||W|| = eta (Eq. 4)."""
    u_hat = u / frobenius(u).clamp_min(1e-30)
    displacement = -eta * R * u_hat
    W_tilde = W + displacement
    return R * W_tilde / frobenius(W_tilde), displacement


def muon_update(W: torch.Tensor, u: torch.Tensor, eta: float, weight_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Puro Eq. 3 (ordinary Muon, decoupled weight decay): W' = (1 - lambda eta) W - eta u.
    Returns (W', the gradient displacement -eta u)."""
    displacement = -eta * u
    return (1 - weight_decay * eta) * W + displacement, displacement


def elr_aligned_update(W: torch.Tensor, u: torch.Tensor, rho: float, weight_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Puro Eq. 5: ordinary Muon whose per-matrix step eta_t = rho^H ||W_t|| / ||u_t|| makes its
    effective LR equal MuonH's rate rho^H, without the projection. Weight decay uses that eta_t."""
    eta = rho * frobenius(W) / frobenius(u).clamp_min(1e-30)
    displacement = -eta * u
    return (1 - weight_decay * eta) * W + displacement, displacement


def effective_lr(displacement: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Measured rho = ||displacement|| / ||W|| per matrix (Eq. 4), shape (...,)."""
    return (frobenius(displacement) / frobenius(W)).flatten()


def bucket_step_(W: list[torch.Tensor], bufs: list[torch.Tensor], grads: list[torch.Tensor], lr, weight_decay, radius,
                 *, rule: str, momentum: float, nesterov: bool, scale: float, orthogonalize,
                 write_to: list[torch.Tensor] | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One step of the matrices of one shape (fp32 `W`, their momentum buffers and gradients): momentum in
    place on `bufs`, u = orthogonalize(look-ahead) x scale, then the rule's update (Eq. 1, 3 or 5).

    Returns (the new matrices as a (k, m, n) stack, rho per matrix (Eq. 4)); with `write_to` the new
    matrices are copied into those tensors instead (and None is returned for them). Pure tensor code
    with no host sync, so that one process compiles it whole (`MatrixOptimizer(compile=True)`)."""
    m = nesterov_momentum_(bufs, grads, momentum, nesterov)
    u = orthogonalize(torch.stack(m))
    if scale != 1.0:
        u = u * scale
    W_stack = torch.stack(W)
    if rule == "muonh":
        W_new, disp = hyperball_update(W_stack, u, lr, radius)
    elif rule == "muon":
        W_new, disp = muon_update(W_stack, u, lr, weight_decay)
    else:
        W_new, disp = elr_aligned_update(W_stack, u, lr, weight_decay)
    rho = effective_lr(disp, W_stack)
    if write_to is None:
        return W_new, rho
    torch._foreach_copy_(write_to, list(W_new.unbind(0)))
    return None, rho


# --------------------------------------------------------------------------------------------
# The matrix optimizer
# --------------------------------------------------------------------------------------------

def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a DTensor; an all-gather), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


@torch.no_grad()
def write_full_(p: torch.Tensor, value: torch.Tensor) -> None:
    """p <- value, where p may be an FSDP2 row shard (this rank's rows of `value` are copied)."""
    if not hasattr(p, "to_local"):
        p.copy_(value)
        return
    local = p.to_local()
    rank, world = _dp_world()
    rows = value.chunk(world, dim=0)                      # FSDP2's Shard(0) split
    if rank < len(rows) and local.numel():
        local.copy_(rows[rank])


def _per_matrix(values: list[float], device: torch.device) -> float | torch.Tensor:
    """A bucket's per-matrix setting (lr, weight decay): a Python float when all are equal (the usual
    case: no host-to-device copy, which would wait for the GPU), else a (k, 1, 1) tensor."""
    if all(v == values[0] for v in values):
        return values[0]
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1, 1)


def _dp_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class MatrixOptimizer(torch.optim.Optimizer):
    """Orthogonalized-momentum optimizer for 2-D weights with three update rules:

    - `muonh`: Hyperball projection at the initial radius (Eq. 1), no weight decay.
    - `muon`: ordinary Muon, update scaled by sqrt(max(1, rows/cols)), decoupled weight decay (Eq. 3).
    - `muon_elr`: Muon with its per-matrix step set so that rho equals the group's rate (Eq. 5).

    Each param group carries `lr` (set by the training loop every step: m x base) and `name`.
    After `step()`, `last_effective_lr` maps group name -> list of measured rho per matrix.
    """

    def __init__(self, param_groups: list[dict[str, Any]], rule: str = "muonh", momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, ns_coeffs=NS_COEFFS, ns_dtype: str = "auto",
                 weight_decay: float = 0.0, muon_scale: str = "shape", distribute: bool = True,
                 compile: bool = False, ns_form: str = "standard"):
        if rule not in ("muonh", "muon", "muon_elr"):
            raise ValueError(f"unknown matrix rule {rule!r}")
        if ns_form not in NS_FORMS:
            raise ValueError(f"unknown Newton-Schulz form {ns_form!r}: expected one of {NS_FORMS}")
        defaults = dict(lr=0.0, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        super().__init__(param_groups, defaults)
        for g in self.param_groups:
            for p in g["params"]:
                if p.ndim != 2:
                    raise ValueError(f"{rule} takes 2-D matrices; group {g.get('name')} has shape {tuple(p.shape)}")
        self.rule, self.ns_steps, self.ns_coeffs = rule, ns_steps, tuple(ns_coeffs)
        self.ns_dtype, self.muon_scale, self.distribute = ns_dtype, muon_scale, distribute
        self.ns_form = ns_form
        self.last_effective_lr: dict[str, list[float]] = {}
        self.measure = True                   # measure rho this step (a host sync; the loop turns it off)
        self._radius_cache: dict[tuple[int, int], tuple[list[torch.Tensor], torch.Tensor]] = {}
        # one process on CUDA: each shape's step as one compiled graph (Inductor fuses the momentum, the stacks,
        # the norms and the projection around the Newton-Schulz GEMMs: fewer passes over the fp32 matrices)
        self._compiled = torch.compile(bucket_step_, dynamic=False) if compile else None
        self._ns_fns: dict[torch.device, Any] = {}
        self._lr_tensors: dict[tuple[int, int], torch.Tensor] = {}
        if rule == "muonh":
            self._init_radius()

    @torch.no_grad()
    def _init_radius(self) -> None:
        """R = ||W_0||_F per matrix, fixed for the rest of training and checkpointed."""
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                if "radius" not in st:
                    R = full(p.detach()).float().norm()
                    if R == 0:
                        raise ValueError(f"MuonH needs non-zero initial matrices (group {g.get('name')}): "
                                         "the radius R = ||W_0||_F would be 0")
                    st["radius"] = R

    def _ns_dtype(self, device: torch.device) -> torch.dtype:
        return ns_dtype_for(self.ns_dtype, self.ns_form, device)

    @torch.no_grad()
    def _orthogonalize(self, stack: torch.Tensor) -> torch.Tensor:
        """Newton-Schulz on a (k, m, n) stack; split across data-parallel ranks when enabled."""
        rank, world = _dp_world()
        dtype = self._ns_dtype(stack.device)
        if not self.distribute or world == 1:
            return newton_schulz(stack, self.ns_steps, self.ns_coeffs, dtype, form=self.ns_form)
        k = stack.shape[0]
        per_rank = math.ceil(k / world)
        padded = torch.zeros((per_rank * world, *stack.shape[1:]), dtype=stack.dtype, device=stack.device)
        padded[:k] = stack
        mine = newton_schulz(padded[rank * per_rank:(rank + 1) * per_rank], self.ns_steps, self.ns_coeffs, dtype,
                             form=self.ns_form)
        gathered = torch.empty_like(padded)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(gathered, mine.contiguous())
        return gathered[:k]

    def _momentum_buffer(self, p: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(full(p.detach()), dtype=torch.float32)
        return st["momentum_buffer"]

    def _radii(self, shape: tuple[int, int], params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The bucket's radii as one (k, 1, 1) device tensor, stacked once (R never changes; a
        checkpoint load replaces the state tensors, so the cache holds and compares those tensors)."""
        radii = [self.state[p]["radius"] for p in params]
        cached = self._radius_cache.get(shape)
        if cached is None or len(cached[0]) != len(radii) or any(a is not b for a, b in zip(cached[0], radii)):
            cached = (radii, torch.stack([r.to(device) for r in radii]).view(-1, 1, 1))
            self._radius_cache[shape] = cached
        return cached[1]

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closures are not supported")
        self.last_effective_lr = {}
        # Bucket every matrix with a gradient by shape (all groups together: one NS per shape).
        buckets: dict[tuple[int, int], list[tuple[dict, torch.nn.Parameter]]] = defaultdict(list)
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    buckets[tuple(p.shape)].append((g, p))
        for shape, items in buckets.items():
            params = [p for _, p in items]
            g0 = items[0][0]
            sharded = any(hasattr(p, "to_local") for p in params)
            local = not sharded and _dp_world()[1] == 1 and all(p.dtype == torch.float32 for p in params)
            W = [full(p.detach()).float() for p in params]          # local fp32 matrices: the parameters themselves
            device = W[0].device
            compiled = self._compiled is not None and local and device.type == "cuda"
            lr = _per_matrix([g["lr"] for g, _ in items], device)
            if compiled and not isinstance(lr, torch.Tensor):
                lr = self._lr_tensor(shape, lr, device)         # a tensor input: a float would be a guard (a recompile a step)
            W_new, rho = (self._compiled if compiled else bucket_step_)(
                W, [self._momentum_buffer(p) for p in params], [full(p.grad).float() for p in params],
                lr, _per_matrix([g["weight_decay"] for g, _ in items], device),
                self._radii(shape, params, device) if self.rule == "muonh" else None,
                rule=self.rule, momentum=g0["momentum"], nesterov=g0["nesterov"],
                scale=math.sqrt(max(1.0, shape[0] / shape[1])) if self.rule == "muon" and self.muon_scale == "shape" else 1.0,
                orthogonalize=self._orthogonalize if not local else self._local_newton_schulz(device),
                write_to=W if local else None)
            if W_new is not None:
                for p, w_new in zip(params, W_new.unbind(0)):
                    write_full_(p, w_new)
            if self.measure:
                for (g, _), r in zip(items, rho.tolist()):
                    self.last_effective_lr.setdefault(g["name"], []).append(r)
        return None

    def _lr_tensor(self, shape: tuple[int, int], lr: float, device: torch.device) -> torch.Tensor:
        """The bucket's learning rate in a 0-d device tensor of its own, refilled each step (no host sync)."""
        t = self._lr_tensors.get(shape)
        if t is None:
            t = self._lr_tensors[shape] = torch.zeros((), dtype=torch.float32, device=device)
        return t.fill_(lr)

    def _local_newton_schulz(self, device: torch.device):
        """Newton-Schulz with this optimizer's settings, one object per device (the compiled step guards on it)."""
        fn = self._ns_fns.get(device)
        if fn is None:
            fn = self._ns_fns[device] = functools.partial(newton_schulz, steps=self.ns_steps, coeffs=self.ns_coeffs,
                                                          dtype=self._ns_dtype(device), form=self.ns_form)
        return fn


# --------------------------------------------------------------------------------------------
# Both optimizers behind one object
# --------------------------------------------------------------------------------------------

class CombinedOptimizer:
    """The matrix optimizer (if any) plus AdamW, stepped together. Every param group has `name` and
    `lr_mult`; `set_lr(base)` sets lr = lr_mult x base for all of them (Puro: m for MuonH groups,
    1 for AdamW groups; both share the base schedule)."""

    def __init__(self, optimizers: dict[str, torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    def set_lr(self, lr_base: float) -> dict[str, float]:
        out = {}
        for g in self.param_groups:
            g["lr"] = lr_base * g["lr_mult"]
            out[g["name"]] = g["lr"]
        return out

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def measure_effective_lr(self, on: bool) -> None:
        opt = self.optimizers.get("matrix")
        if opt is not None:
            opt.measure = on

    @property
    def effective_lr(self) -> dict[str, list[float]]:
        opt = self.optimizers.get("matrix")
        return getattr(opt, "last_effective_lr", {}) if opt is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {k: opt.state_dict() for k, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != set(self.optimizers):
            raise ValueError(f"optimizer state has parts {sorted(state)}, this run has {sorted(self.optimizers)} "
                             "(was the checkpoint written with another optimizer.matrix?)")
        for k, opt in self.optimizers.items():
            opt.load_state_dict(state[k])

    def load_state_tensors(self, state: dict[str, Any]) -> None:
        """Load the checkpoint's state tensors but keep this optimizer's settings (init_from)."""
        self.load_state_dict({k: _with_current_settings(state[k], opt.state_dict(), k)
                              for k, opt in self.optimizers.items() if k in state} if set(state) == set(self.optimizers)
                             else state)


def _with_current_settings(saved: dict[str, Any], current: dict[str, Any], part: str) -> dict[str, Any]:
    """`saved`'s state tensors under `current`'s param-group settings (lr_mult, momentum, weight
    decay, betas ...): what `init_from` loads, so a phase-2 config's optimizer settings apply."""
    if len(saved["param_groups"]) != len(current["param_groups"]):
        raise ValueError(f"optimizer part {part!r}: the checkpoint has {len(saved['param_groups'])} param groups, "
                         f"this run {len(current['param_groups'])}")
    groups = []
    for s, c in zip(saved["param_groups"], current["param_groups"]):
        if len(s["params"]) != len(c["params"]) or s.get("name") != c.get("name"):
            raise ValueError(f"optimizer part {part!r}: param group {c.get('name')!r} ({len(c['params'])} tensors) "
                             f"does not match the checkpoint's {s.get('name')!r} ({len(s['params'])})")
        groups.append({**c, "params": s["params"]})
    return {"state": saved["state"], "param_groups": groups}


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, compile: bool = False) -> CombinedOptimizer:
    """Route the model's parameters (behaviour 20) and build MuonH/Muon/ELR-Muon + AdamW groups
    (`compile`: the matrix step compiled, on one CUDA process).

    One param group per role, so metrics and learning rates are reported per role."""
    routed = route_params(model.named_parameters())
    matrix_groups, adam_groups = [], []
    for role, items in routed.items():
        params = [p for _, p in items]
        if is_matrix_role(role) and cfg.matrix != "adamw":
            matrix_groups.append(dict(params=params, name=f"{cfg.matrix}/{role}", lr_mult=cfg.matrix_lr_mult,
                                      weight_decay=0.0 if cfg.matrix == "muonh" else cfg.muon_weight_decay))
        else:
            decay = cfg.adam_weight_decay if role in ("embed", "lm_head") or (is_matrix_role(role)) else 0.0
            adam_groups.append(dict(params=params, name=f"adamw/{role}", lr_mult=1.0, weight_decay=decay))
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if matrix_groups:
        optimizers["matrix"] = MatrixOptimizer(
            matrix_groups, rule=cfg.matrix, momentum=cfg.momentum, nesterov=cfg.nesterov, ns_steps=cfg.ns_steps,
            ns_coeffs=cfg.ns_coeffs, ns_dtype=cfg.ns_dtype, muon_scale=cfg.muon_scale, distribute=cfg.distribute_ns,
            compile=compile, ns_form=cfg.ns_form)
    # fused (one kernel for all tensors) where every parameter is on CUDA, foreach elsewhere
    on_cuda = all(p.device.type == "cuda" for g in adam_groups for p in g["params"])
    optimizers["adamw"] = torch.optim.AdamW(adam_groups, lr=0.0, betas=cfg.adam_betas, eps=cfg.adam_eps,
                                            **({"fused": True} if on_cuda else {"foreach": True}))
    return CombinedOptimizer(optimizers)
