"""`python -m mixtures inspect <shard set or a directory of them> [--plots DIR]`: what is in a set.

Prints each set's composition per segment (curriculum bucket, uniform slot, transition window):
tokens, component shares, token-weighted mean within-component rank. Writes PNG plots: component
share per segment for each set, and the mean within-component rank along the stream of every set
side by side (curriculum rises from ~0 to ~1, uniform stays at ~0.5: Puro behaviours 9 and 10).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from purokit import storage
from purokit.errors import ContractError
from purokit.manifest import MANIFEST_NAME
from mixtures.shards import INDEX_SUFFIX, TOKENS_SUFFIX, ShardManifest, ShardSet


def find_sets(path: str | os.PathLike) -> dict[str, Path]:
    """The shard set at `path`, or every directory directly under it with a manifest, by name (an
    unreadable manifest, or shard files without a manifest, are not skipped: `inspect_sets` reports them)."""
    p = storage.path(path)
    if _is_set(p) or (p.is_dir() and _holds_shard_files(p)):
        return {p.name: p}
    out = {}
    for d in sorted(p.iterdir()) if p.is_dir() else []:
        if d.is_dir() and not d.name.startswith(".") and (_is_set(d) or _holds_shard_files(d)):
            out[d.name] = d
    return out


def _is_set(d) -> bool:
    try:
        return storage.has_committed(d, MANIFEST_NAME)
    except ContractError:               # an unreadable commit record: reported when the set is opened
        return True


def _holds_shard_files(d) -> bool:
    """Whether directory `d` holds (commits, on an object store) token or index files of shards."""
    if storage.is_remote(d):
        record = storage.read_commit(d)
        names = [f["path"] for f in record["files"]] if record else []
    else:
        names = [f.name for f in d.iterdir()]
    return any(n.endswith((TOKENS_SUFFIX, INDEX_SUFFIX)) for n in names)


def describe(name: str, m: ShardManifest, max_rows: int = 40) -> list[str]:
    """Human-readable composition table of one set."""
    lines = [f"{name}: {m.kind} {m.stream}, {m.n_tokens:,} tokens, {m.n_docs:,} docs, {len(m.shards)} shards, "
             f"seq_len {m.seq_len}, {m.dtype}, tokenizer {m.tokenizer.name} ({m.tokenizer.digest[:12]})"]
    if m.bucket_count:
        lines.append(f"  K = {m.bucket_count} buckets; spec {m.spec_hash[:12] if m.spec_hash else '-'}")
    if "transition" in m.extra:
        t = m.extra["transition"]
        lines.append(f"  transition from {t['from_phase']} over {t['transition_tokens']:,} tokens: "
                     f"{t['replay_tokens']:,} replay + {t['phase_tokens']:,} phase tokens")
    comps = sorted({c for s in m.segments for c in s.tokens_by_component})
    if not m.segments:
        return lines
    head = f"  {'segment':>8} {'tokens':>12} " + " ".join(f"{c[:14]:>14}" for c in comps) + f" {'mean rank':>9}"
    lines.append(head)
    rows = m.segments if len(m.segments) <= max_rows else m.segments[: max_rows // 2] + m.segments[-max_rows // 2:]
    for i, s in enumerate(rows):
        if len(m.segments) > max_rows and i == max_rows // 2:
            lines.append(f"  {'...':>8}")
        shares = " ".join(f"{100 * s.tokens_by_component.get(c, 0) / max(s.n_tokens, 1):13.1f}%" for c in comps)
        rank = f"{s.mean_rank:9.3f}" if s.mean_rank is not None else f"{'-':>9}"
        lines.append(f"  {s.name:>8} {s.n_tokens:>12,} {shares} {rank}")
    return lines


def plot_composition(name: str, m: ShardManifest, path: Path) -> Path:
    """Stacked bars: each component's share of every segment."""
    comps = sorted({c for s in m.segments for c in s.tokens_by_component})
    fig, ax = _pyplot().subplots(figsize=(max(6, 0.25 * len(m.segments) + 3), 3.6))
    bottom = [0.0] * len(m.segments)
    x = list(range(len(m.segments)))
    for c in comps:
        share = [s.tokens_by_component.get(c, 0) / max(s.n_tokens, 1) for s in m.segments]
        ax.bar(x, share, bottom=bottom, label=c, width=0.9)
        bottom = [b + v for b, v in zip(bottom, share)]
    ax.set_xticks(x[:: max(1, len(x) // 16)], [m.segments[i].name for i in x[:: max(1, len(x) // 16)]], rotation=45)
    ax.set_ylabel("share of segment tokens")
    return _save(fig, ax, path, f"{name}: component share per segment", legend_size=7)


def plot_rank_profiles(manifests: dict[str, ShardManifest], path: Path) -> Path:
    """Mean within-component rank along each stream (segments in stream order, x = fraction of the
    stream's tokens at the segment's middle), one line per set and component."""
    fig, ax = _pyplot().subplots(figsize=(7, 4))
    styles = ["-", "--", ":", "-."]
    for si, (name, m) in enumerate(manifests.items()):
        total = max(m.n_tokens, 1)
        comps = sorted({c for s in m.segments for c, r in s.mean_rank_by_component.items()
                        if r is not None and not c.startswith("replay:")})
        pos, mids = 0, []
        for s in m.segments:
            mids.append((pos + s.n_tokens / 2) / total)
            pos += s.n_tokens
        for c in comps:
            pts = [(x, s.mean_rank_by_component.get(c)) for x, s in zip(mids, m.segments)
                   if s.mean_rank_by_component.get(c) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[si % len(styles)], marker=".",
                        label=f"{name}: {c}")
    ax.plot([0, 1], [0, 1], color="grey", lw=0.5)
    ax.set_xlabel("position in the stream (fraction of tokens)")
    ax.set_ylabel("mean within-component rank")
    return _save(fig, ax, path, "curriculum vs uniform: mean within-component rank", legend_size=6)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, ax: Any, path: Path, title: str, legend_size: int) -> Path:
    """Shares on [0, 1], the legend beside the axes, written as PNG."""
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=legend_size, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def inspect_sets(path: str | os.PathLike, plots_dir: str | os.PathLike | None = None,
                 verify: bool = False) -> tuple[list[str], list[Path], list[str]]:
    """Lines to print, plot files written, and the errors of the sets that could not be read (or,
    with `verify`, whose files do not match their hashes), for every set at/under `path`."""
    sets = find_sets(path)
    if not sets:
        raise FileNotFoundError(f"no shard set at or under {path}")
    manifests = {}
    lines: list[str] = []
    failures: list[str] = []
    for name, d in sets.items():
        try:
            m = ShardSet.open(d, verify_hashes=verify).manifest
        except ContractError as e:
            failures.append(f"{name}: {e}")
            lines.append(f"{name}: UNREADABLE: {e}")
            continue
        manifests[name] = m
        lines.extend(describe(name, m))
        if verify:
            lines.append("  every file matches its sha256")
    plots: list[Path] = []
    if plots_dir is not None:
        out = Path(plots_dir)
        for name, m in manifests.items():
            if m.segments:
                plots.append(plot_composition(name, m, out / f"{name}.composition.png"))
        ranked = {n: m for n, m in manifests.items() if any(s.mean_rank is not None for s in m.segments)}
        if ranked:
            plots.append(plot_rank_profiles(ranked, out / "rank_profiles.png"))
    return lines, plots, failures
