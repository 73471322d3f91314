"""Fits used to read proxy and scaling experiments.

1. Saturating power law of loss in compute, L(C) = a·C^b + c (b < 0).
2. The Puro cost law (Puro §4.3, spec §6): P = a + b·log2(C − C0), with C the total cost and C0 the
   fixed Phase 1 cost (USD 1.84K), fitted by least squares in x = log2(C − C0); its inverse
   C(P) = C0 + 2^((P − a)/b) turns a score into the budget a baseline would need (behaviour 33:
   a = 53.86, b = 1.019 give C(57.17) ≈ 11.36K and C(57.81) ≈ 16.55K).
3. The Multi-Power Law of loss versus learning-rate schedule (Luo et al. 2025, "A Multi-Power Law
   for Loss Curve Prediction Across Learning Rate Schedules", arXiv 2503.12811; Puro Appendix F.1
   uses it but the seed omits the formula):

       L(t)  = L0 + A·(S1(t) + S_W)^(−α) − LD(t)
       S1(t) = Σ_{τ=1..t} η_τ                      (learning-rate sum after warmup)
       LD(t) = B · Σ_{k=1..t} (η_{k−1} − η_k) · G(η_k^(−γ) · S_k(t)),   S_k(t) = Σ_{τ=k..t} η_τ
       G(x)  = 1 − (C·x + 1)^(−β)

   with η_0 the peak learning rate and S_W the warmup's learning-rate sum. A constant schedule has
   LD ≡ 0 and the loss falls monotonically in S1 (behaviour 30).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2)))


# ---- 1. L = a C^b + c ------------------------------------------------------------------------

@dataclass(frozen=True)
class PowerLawFit:
    a: float
    b: float
    c: float
    rmse: float

    def predict(self, compute: np.ndarray | float) -> np.ndarray:
        return self.a * np.power(np.asarray(compute, dtype=np.float64), self.b) + self.c

    def compute_for(self, loss: float) -> float:
        """Compute at which the fit reaches `loss` (inf when loss <= c)."""
        if loss <= self.c:
            return math.inf
        return float(((loss - self.c) / self.a) ** (1.0 / self.b))


def fit_power_law(compute: Sequence[float], loss: Sequence[float]) -> PowerLawFit:
    """Least squares for L = a·C^b + c. Initialized by a grid over c with a log-linear fit of
    log(L − c) on log C, then refined jointly (in log C for conditioning)."""
    C = np.asarray(compute, dtype=np.float64)
    L = np.asarray(loss, dtype=np.float64)
    if len(C) < 3:
        raise ValueError("a 3-parameter power law needs at least 3 points")
    if (C <= 0).any():
        raise ValueError("compute must be positive")
    logC = np.log(C)
    best = None
    span = L.max() - L.min()
    for c in np.concatenate([np.linspace(L.min() - 2 * span - 1e-9, L.min() - 1e-6 * (span + 1), 60), [0.0]]):
        if (L - c <= 0).any():
            continue
        slope, intercept = np.polyfit(logC, np.log(L - c), 1)
        pred = np.exp(intercept + slope * logC) + c
        err = float(np.sum((pred - L) ** 2))
        if best is None or err < best[0]:
            best = (err, np.exp(intercept), slope, c)
    assert best is not None
    x0 = np.array([math.log(best[1]), best[2], best[3]])

    def resid(p: np.ndarray) -> np.ndarray:
        return np.exp(p[0] + p[1] * logC) + p[2] - L

    sol = least_squares(resid, x0, method="lm", xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=20000)
    a, b, c = float(np.exp(sol.x[0])), float(sol.x[1]), float(sol.x[2])
    fit = PowerLawFit(a, b, c, 0.0)
    return PowerLawFit(a, b, c, rmse(fit.predict(C), L))


# ---- 2. Puro cost law --------------------------------------------------------------------------

PURO_C_P1_KUSD = 1.84   # Phase 1 cost in thousands of USD (6009.46 GPU-h × $0.30608/h), Puro §4.3


@dataclass(frozen=True)
class CostLawFit:
    a: float
    b: float
    c0: float
    rmse: float

    def predict(self, cost: np.ndarray | float) -> np.ndarray:
        return cost_law(np.asarray(cost, dtype=np.float64), self.a, self.b, self.c0)

    def invert(self, score: float) -> float:
        return invert_cost_law(score, self.a, self.b, self.c0)


def cost_law(cost: np.ndarray | float, a: float, b: float, c0: float = PURO_C_P1_KUSD) -> np.ndarray:
    """P = a + b·log2(C − C0)."""
    return a + b * np.log2(np.asarray(cost, dtype=np.float64) - c0)


def invert_cost_law(score: float, a: float, b: float, c0: float = PURO_C_P1_KUSD) -> float:
    """C(P) = C0 + 2^((P − a)/b): the cost at which the law reaches score P."""
    return c0 + 2.0 ** ((score - a) / b)


def fit_cost_law(cost: Sequence[float], score: Sequence[float], c0: float = PURO_C_P1_KUSD) -> CostLawFit:
    """Least squares for a, b with C0 held fixed (Puro fits UD runs resumed from one Phase 1
    checkpoint, so the Phase 1 cost is a constant shift)."""
    C = np.asarray(cost, dtype=np.float64)
    P = np.asarray(score, dtype=np.float64)
    if (C <= c0).any():
        raise ValueError(f"every cost must exceed C0 = {c0}")
    x = np.log2(C - c0)
    b, a = np.polyfit(x, P, 1)
    return CostLawFit(float(a), float(b), c0, rmse(a + b * x, P))


# ---- 3. Multi-Power Law ------------------------------------------------------------------------

@dataclass(frozen=True)
class MPLParams:
    L0: float
    A: float
    alpha: float
    B: float
    C: float
    beta: float
    gamma: float

    def to_array(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=np.float64)

    @classmethod
    def from_array(cls, x: Sequence[float]) -> "MPLParams":
        return cls(*[float(v) for v in x])

    def to_dict(self) -> dict:
        return asdict(self)


def mpl_loss(lrs: Sequence[float], params: MPLParams, steps: Sequence[int] | None = None,
             warmup_sum: float = 0.0, eta0: float | None = None) -> np.ndarray:
    """Predicted loss at `steps` (1-based, default every step) for the post-warmup schedule
    `lrs` = η_1..η_T. η_0 (the peak) defaults to η_1; `warmup_sum` is S_W."""
    eta = np.asarray(lrs, dtype=np.float64)
    T = len(eta)
    t = np.arange(1, T + 1) if steps is None else np.asarray(steps, dtype=np.int64)
    if len(t) and (t.min() < 1 or t.max() > T):
        raise ValueError(f"steps must lie in 1..{T}")
    e0 = eta[0] if eta0 is None else float(eta0)
    cum = np.concatenate([[0.0], np.cumsum(eta)])            # cum[t] = S1(t)
    prev = np.concatenate([[e0], eta[:-1]])
    delta = prev - eta                                       # η_{k-1} − η_k, k = 1..T
    nz = np.flatnonzero(delta != 0.0)
    base = params.L0 + params.A * np.power(cum[t] + warmup_sum, -params.alpha)
    if len(nz) == 0:
        return base
    k = nz + 1                                               # 1-based k with a change
    # S_k(t) = cum[t] − cum[k−1] for k <= t, zero weight otherwise
    Sk = cum[t][:, None] - cum[k - 1][None, :]
    active = k[None, :] <= t[:, None]
    # a step that decays to exactly zero: floor η_k so η_k^(−γ)·S_k stays finite (S_k = 0 gives x = 0)
    eta_k = np.maximum(eta[k - 1], 1e-30)
    x = np.power(eta_k, -params.gamma)[None, :] * np.where(active, np.maximum(Sk, 0.0), 0.0)
    G = 1.0 - np.power(params.C * x + 1.0, -params.beta)
    LD = params.B * np.sum(np.where(active, delta[nz][None, :] * G, 0.0), axis=1)
    return base - LD


@dataclass(frozen=True)
class Curve:
    """One training run: its post-warmup schedule and observed losses at some steps."""

    lrs: Sequence[float]
    steps: Sequence[int]
    loss: Sequence[float]
    warmup_sum: float = 0.0
    eta0: float | None = None
    name: str = ""


@dataclass(frozen=True)
class MPLFit:
    params: MPLParams
    rmse: float                        # over all fitted points
    per_curve_rmse: dict[str, float]
    success: bool
    message: str

    def predict(self, curve: Curve) -> np.ndarray:
        return mpl_loss(curve.lrs, self.params, curve.steps, curve.warmup_sum, curve.eta0)

    def heldout_rmse(self, curve: Curve) -> float:
        return rmse(self.predict(curve), curve.loss)


_POSITIVE = ("A", "alpha", "B", "C", "beta", "gamma")
# bounds of the fitted (log for positive) parameters: keep the optimizer out of absurd regions
_BOUNDS = {"L0": (-np.inf, np.inf), "A": (1e-8, 1e8), "alpha": (1e-4, 10.0), "B": (1e-8, 1e12), "C": (1e-8, 1e8),
           "beta": (1e-4, 10.0), "gamma": (1e-4, 3.0)}


def _default_starts(curves: Sequence[Curve]) -> list[MPLParams]:
    all_loss = np.concatenate([np.asarray(c.loss, dtype=np.float64) for c in curves])
    peak = max(float(np.max(c.lrs)) for c in curves)
    starts = []
    for b_scale in (1.0, 0.1, 10.0):
        for gamma in (0.5, 0.8):
            starts.append(MPLParams(L0=float(all_loss.min()) * 0.9, A=0.5, alpha=0.5, B=b_scale / max(peak, 1e-12),
                                    C=2.0, beta=0.5, gamma=gamma))
    return starts


def fit_mpl(curves: Sequence[Curve], init: MPLParams | None = None, robust: bool = False,
            max_nfev: int = 5000, n_starts: int | None = None) -> MPLFit:
    """Fit the seven MPL parameters to several curves jointly (bounded least squares; `robust`
    uses a soft-L1 loss like the paper's Huber objective). Positive parameters are fitted in log
    space. Several deterministic starting points are tried (plus `init`); the best fit wins."""
    if not curves:
        raise ValueError("no curves to fit")
    names = [f.name for f in fields(MPLParams)]
    pos = np.array([n in _POSITIVE for n in names])
    lo = np.array([math.log(_BOUNDS[n][0]) if n in _POSITIVE else _BOUNDS[n][0] for n in names])
    hi = np.array([math.log(_BOUNDS[n][1]) if n in _POSITIVE else _BOUNDS[n][1] for n in names])

    def unpack(z: np.ndarray) -> MPLParams:
        return MPLParams.from_array(np.where(pos, np.exp(z), z))

    def resid(z: np.ndarray) -> np.ndarray:
        p = unpack(z)
        out = [mpl_loss(c.lrs, p, c.steps, c.warmup_sum, c.eta0) - np.asarray(c.loss, dtype=np.float64) for c in curves]
        r = np.concatenate(out)
        return np.where(np.isfinite(r), r, 1e6)

    starts = ([init] if init is not None else []) + _default_starts(curves)
    if n_starts is not None:
        starts = starts[:max(1, n_starts)]
    best = None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for start in starts:
            x0 = start.to_array()
            z0 = np.clip(np.where(pos, np.log(np.maximum(x0, 1e-300)), x0), lo + 1e-9, hi - 1e-9)
            sol = least_squares(resid, z0, bounds=(lo, hi), loss="soft_l1" if robust else "linear", f_scale=0.01,
                                method="trf", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=max_nfev, x_scale="jac")
            err = float(np.sqrt(np.mean(resid(sol.x) ** 2)))
            if best is None or err < best[0]:
                best = (err, sol)
    assert best is not None
    total, sol = best
    params = unpack(sol.x)
    per = {c.name or f"curve{i}": rmse(mpl_loss(c.lrs, params, c.steps, c.warmup_sum, c.eta0), c.loss)
           for i, c in enumerate(curves)}
    return MPLFit(params, total, per, bool(sol.success), str(sol.message))


# ---- the fits of `python -m proxy_eval fit`: a CSV in, a report out ---------------------------

def _mpl_curves(rows: list[dict], warmup_sum: float) -> dict[str, Curve]:
    """`curve,step,lr,loss` rows as one `Curve` per name (steps without a loss are schedule only)."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["curve"], []).append(r)
    curves = {}
    for name, rs in by.items():
        rs.sort(key=lambda r: int(r["step"]))
        obs = [(int(r["step"]), float(r["loss"])) for r in rs if r.get("loss") not in (None, "")]
        curves[name] = Curve([float(r["lr"]) for r in rs], [s for s, _ in obs], [v for _, v in obs],
                             warmup_sum, None, name)
    return curves


def fit_rows(kind: str, rows: list[dict], *, c0: float = PURO_C_P1_KUSD, invert: Sequence[float] = (),
             heldout: Sequence[str] = (), warmup_sum: float = 0.0) -> dict:
    """The report of one fit of CSV rows: `cost` (cost,score), `power` (compute,loss) or `mpl`
    (curve,step,lr,loss; `heldout` curves are left out of the fit and predicted)."""
    if kind == "cost":
        fit = fit_cost_law([float(r["cost"]) for r in rows], [float(r["score"]) for r in rows], c0=c0)
        return {"law": "P = a + b*log2(C - C0)", "a": fit.a, "b": fit.b, "c0": fit.c0, "rmse": fit.rmse,
                "inversions": {str(p): fit.invert(p) for p in invert}}
    if kind == "power":
        pfit = fit_power_law([float(r["compute"]) for r in rows], [float(r["loss"]) for r in rows])
        return {"law": "L = a*C^b + c", "a": pfit.a, "b": pfit.b, "c": pfit.c, "rmse": pfit.rmse}
    curves = _mpl_curves(rows, warmup_sum)
    held = set(heldout)
    mfit = fit_mpl([c for n, c in curves.items() if n not in held])
    return {"law": "Multi-Power Law (Luo et al. 2025)", "params": mfit.params.to_dict(), "rmse": mfit.rmse,
            "per_curve_rmse": mfit.per_curve_rmse,
            "heldout_rmse": {n: mfit.heldout_rmse(curves[n]) for n in held if n in curves}}
