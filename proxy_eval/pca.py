"""PCA of capability vectors (Puro §3.6.1, "Capability balance across domains"; Figure 20).

Rows are slices (or sources), columns capabilities (group scores or benchmark scores). Columns are
z-scored across rows with the population standard deviation before the decomposition, since the
groups have different scales (the spec's [CHOICE], anchors.md §3.2: "z-score per task before
decomposing"). Signs of principal axes are arbitrary in an SVD; here each axis is oriented so that
its *anchor* variable loads positively: by default the Puro reading (PC1 along General, PC2 along
Math), falling back to the variable with the largest absolute loading. The same inputs therefore
always give the same picture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from purokit import atomic

DEFAULT_SIGN_ANCHORS = ("General", "Math")


@dataclass
class PCAResult:
    rows: list[str]
    variables: list[str]
    explained_variance_ratio: np.ndarray      # (k,)
    loadings: np.ndarray                      # (p, k): unit eigenvectors, variables × components
    scores: np.ndarray                        # (n, k): z-scored data projected on the components
    mean: np.ndarray
    std: np.ndarray
    dropped: list[str] = field(default_factory=list)   # constant columns (no variance to explain)

    def loading(self, variable: str, component: int) -> float:
        return float(self.loadings[self.variables.index(variable), component])

    def to_dict(self) -> dict:
        k = self.loadings.shape[1]
        return {
            "rows": self.rows, "variables": self.variables, "dropped": self.dropped,
            "explained_variance_ratio": [float(x) for x in self.explained_variance_ratio],
            "loadings": {v: [float(self.loadings[i, j]) for j in range(k)] for i, v in enumerate(self.variables)},
            "scores": {r: [float(self.scores[i, j]) for j in range(k)] for i, r in enumerate(self.rows)},
            "mean": {v: float(m) for v, m in zip(self.variables, self.mean)},
            "std": {v: float(s) for v, s in zip(self.variables, self.std)},
        }


def zscore(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Column z-scores with the population standard deviation (ddof=0)."""
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    return (x - mean) / std, mean, std


def canonical_signs(loadings: np.ndarray, variables: Sequence[str], anchors: Sequence[str] | None) -> np.ndarray:
    """+1/-1 per component so that the anchor variable's loading is positive. Component j's anchor is
    anchors[j] when given and present (and its loading is not ~0), else the variable with the
    largest |loading| (the first such on ties)."""
    k = loadings.shape[1]
    signs = np.ones(k)
    for j in range(k):
        col = loadings[:, j]
        idx = None
        if anchors is not None and j < len(anchors) and anchors[j] in variables:
            i = list(variables).index(anchors[j])
            if abs(col[i]) > 1e-9:
                idx = i
        if idx is None:
            idx = int(np.argmax(np.round(np.abs(col), 12)))
        signs[j] = -1.0 if col[idx] < 0 else 1.0
    return signs


def capability_pca(matrix: np.ndarray, rows: Sequence[str], variables: Sequence[str],
                   sign_anchors: Sequence[str] | None = DEFAULT_SIGN_ANCHORS) -> PCAResult:
    """PCA of the z-scored `matrix` (rows × variables) by SVD."""
    x = np.asarray(matrix, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"PCA needs a 2-D matrix with at least 2 rows, got shape {x.shape}")
    if np.isnan(x).any():
        bad = [rows[i] for i in np.flatnonzero(np.isnan(x).any(axis=1))]
        raise ValueError(f"PCA input has missing scores for rows {bad}")
    variables = list(variables)
    keep = x.std(axis=0) > 1e-12
    dropped = [v for v, k in zip(variables, keep) if not k]
    x = x[:, keep]
    variables = [v for v, k in zip(variables, keep) if k]
    if x.shape[1] < 1:
        raise ValueError("every capability is constant across rows: nothing to decompose")
    z, mean, std = zscore(x)
    _, s, vt = np.linalg.svd(z, full_matrices=False)
    var = s ** 2
    ratio = var / var.sum()
    loadings = vt.T
    signs = canonical_signs(loadings, variables, sign_anchors)
    loadings = loadings * signs
    scores = z @ loadings
    return PCAResult(list(rows), variables, ratio, loadings, scores, mean, std, dropped)


def _label_points(ax, names: Sequence[str], xs: np.ndarray, ys: np.ndarray) -> None:
    """Label points, moving a label to another side of its point when it would sit on top of one
    already placed (greedy, in display pixels; deterministic)."""
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 14), (5, -21), (-5, 14), (-5, -21)]
    placed: list[tuple[float, float, float]] = []     # x, y of the label anchor, width in px
    to_px = ax.transData.transform
    for i in sorted(range(len(names)), key=lambda k: (-ys[k], xs[k])):
        px, py = to_px((xs[i], ys[i]))
        width = 5.5 * len(names[i])
        choice = offsets[0]
        for dx, dy in offsets:
            lx = px + dx - (width if dx < 0 else 0)
            if all(abs(ly - (py + dy)) >= 11 or lx + width < ox or lx > ox + ow for ox, ly, ow in placed):
                choice = (dx, dy)
                break
        dx, dy = choice
        placed.append((px + dx - (width if dx < 0 else 0), py + dy, width))
        ax.annotate(names[i], (xs[i], ys[i]), textcoords="offset points", xytext=(dx, dy), fontsize=8,
                    color="#1a365d", ha="right" if dx < 0 else "left")


def biplot(result: PCAResult, out: str | Path, title: str = "Capability profiles (z-scored PCA)") -> Path:
    """Rows as points on PC1/PC2 and variables as arrows (loadings scaled to the point cloud)."""
    out = Path(out)
    k = result.loadings.shape[1]
    pc2 = result.scores[:, 1] if k > 1 else np.zeros(len(result.rows))
    fig = Figure(figsize=(7.5, 6.0), dpi=110)   # the object API: no pyplot backend, no global state
    ax = fig.subplots()
    ax.axhline(0, color="#bbbbbb", lw=0.8)
    ax.axvline(0, color="#bbbbbb", lw=0.8)
    ax.scatter(result.scores[:, 0], pc2, s=36, color="#2b6cb0", zorder=3)
    extent = max(1e-9, float(np.abs(np.c_[result.scores[:, 0], pc2]).max()))
    lim = 1.25 * extent
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    _label_points(ax, result.rows, result.scores[:, 0], pc2)
    scale = 0.9 * extent / max(1e-9, float(np.abs(result.loadings[:, :2]).max()))
    for i, v in enumerate(result.variables):
        lx = result.loadings[i, 0] * scale
        ly = (result.loadings[i, 1] if k > 1 else 0.0) * scale
        ax.annotate("", xy=(lx, ly), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="#c53030", lw=1.6))
        ax.text(lx * 1.1, ly * 1.1, v, color="#c53030", fontsize=10, fontweight="bold", ha="center", va="center",
                bbox=dict(facecolor="white", alpha=0.75, edgecolor="none", pad=1.0), zorder=4)
    evr = result.explained_variance_ratio
    ax.set_xlabel(f"PC1 ({100 * evr[0]:.1f}% of variance)")
    ax.set_ylabel(f"PC2 ({100 * evr[1]:.1f}% of variance)" if k > 1 else "PC2 (none)")
    ax.set_title(title)
    ax.set_aspect("equal", adjustable="box")
    fig.tight_layout()
    with atomic.atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, format="png")
    return out
