"""Demo stage "mixtures": a two-phase mixture spec over the demo components, materialized into
static shard sets (Puro §3.4, §3.6.2):

- phase 1 (broad): every component, a uniform stream;
- phase 2 (richer in the specialist sources, math and code, and only the better part of the
  scored general sources): a curriculum stream and a uniform stream from the SAME pool, both
  entered through a linear phase transition that replays phase-1 data;
- a held-out eval set, excluded from both phases.

Prints each set's composition and writes the plots (component share per segment; mean
within-component rank along the stream, curriculum vs uniform).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from purokit import atomic

SPECIALIST = ("math", "code")


def _score_field(columns: list[str]) -> str | None:
    scores = [c for c in columns if c.startswith("quality.")]
    for pref in ("edu", "hq", "quality", "math", "code"):
        for c in scores:
            if pref in c:
                return c
    return scores[0] if scores else None


def _text_bytes(path: Path) -> int:
    import pyarrow.compute as pc

    from purokit.component import Component

    t = Component.open(path).read(columns=["text"]).column("text")
    return int(pc.sum(pc.binary_length(t.cast("binary"))).as_py() or 0)


def build_spec(components: dict[str, Path], tokenizer_json: str, *, seq_len: int, buckets: int,
               transition_fraction: float, holdout_fraction: float, keep_fraction: dict[str, float],
               tokens_per_byte: float) -> dict[str, Any]:
    from purokit.component import Component

    comps = []
    general, special = [], []
    for name, path in sorted(components.items()):
        c = Component.open(path)
        field = _score_field(c.columns)
        entry: dict[str, Any] = {"name": name, "path": str(path), "order_seed": 1 + len(comps)}
        if field:
            entry["score_field"] = field
        comps.append(entry)
        (special if any(s in name.lower() for s in SPECIALIST) else general).append(name)
    if not special:          # no source named math/code: treat the smallest half as the specialists
        special, general = general[len(general) // 2:], general[:len(general) // 2] or general
    phase2: dict[str, Any] = {}
    # phase 2: specialists take half of the tokens, general sources the other half
    for group, share in ((special, 0.5), (general, 0.5)):
        for n in group:
            phase2[n] = round(share / len(group), 6)
    fix = round(1.0 - sum(phase2.values()), 6)
    first = sorted(phase2)[0]
    phase2[first] = round(phase2[first] + fix, 6)
    retention_p2 = {}
    for e in comps:
        if e.get("score_field") and e["name"] in general:
            retention_p2[e["name"]] = keep_fraction.get(e["name"], 0.8)
    # the scored general sources keep their better part (the proxy stage's suggested fraction when
    # it ran); retention is per component, so both phases draw from that part
    for e in comps:
        if e["name"] in retention_p2:
            e["retention"] = {"rule": "top_fraction", "fraction": retention_p2[e["name"]]}
    total_bytes = sum(_text_bytes(p) for p in components.values())
    transition = int(transition_fraction * total_bytes * tokens_per_byte)
    return {
        "schema": "mixture/1", "name": "demo", "tokenizer": {"kind": "hf", "path": tokenizer_json},
        "seq_len": seq_len, "bucket_count": buckets,
        "seeds": {"bucket_shuffle": 11, "uniform": 12, "replay": 13, "budget": 14, "holdout": 15},
        "holdout": {"fraction": holdout_fraction},
        "components": comps,
        "phases": [
            {"name": "phase1", "orders": ["uniform"], "components": {n: {} for n in sorted(components)}},
            {"name": "phase2", "orders": ["curriculum", "uniform"], "transition_tokens": max(transition, seq_len * 4),
             "components": phase2},
        ],
    }


def run(ctx) -> dict[str, Any]:
    from purokit.demo.context import component_dirs
    from mixtures.inspect import describe, plot_composition, plot_rank_profiles
    from mixtures.materialize import materialize
    from mixtures.spec import load_spec
    from mixtures.tokenizers import load_tokenizer

    comps = component_dirs(ctx.result("kaiyuan"))
    tok_json = ctx.result("tokenizer")["tokenizer"]
    tok = load_tokenizer(tok_json)
    sample = [t for p in list(comps.values())[:3] for t in _sample_texts(p, 50)]
    tokens_per_byte = sum(len(x) for x in tok.encode_batch(sample)) / max(sum(len(t.encode()) for t in sample), 1)
    keep = {}
    try:            # the proxy stage's suggested thresholds, when it ran
        keep = {k: float(v) for k, v in (ctx.results.get("proxy") or {}).get("keep_fraction", {}).items()
                if 0 < float(v) <= 1}
    except (TypeError, ValueError):
        keep = {}
    spec_dict = build_spec(comps, tok_json, seq_len=int(ctx.size("mixtures_seq_len", 256)),
                           buckets=int(ctx.size("mixtures_buckets", 16)),
                           transition_fraction=float(ctx.size("mixtures_transition_fraction", 0.1)),
                           holdout_fraction=float(ctx.size("mixtures_holdout", 0.02)),
                           keep_fraction=keep, tokens_per_byte=tokens_per_byte)
    out = ctx.stage_dir()
    spec_path = out / "mixture.yaml"
    atomic.write_text(spec_path, yaml.safe_dump(spec_dict, sort_keys=False))
    spec = load_spec(spec_path)
    p2 = spec.phase("phase2")
    ctx.step(f"spec {spec_path}: K={spec.bucket_count}, seq_len {spec.seq_len}, phase 2 weights "
             + ", ".join(f"{n} {s.weight:.2f}" for n, s in p2.components.items())
             + f", transition {p2.transition_tokens:,} tokens")
    shards = out / "shards"
    results = materialize(spec, shards, progress=ctx.step)
    for name, m in results.items():
        for line in describe(name, m, max_rows=12):
            ctx.step(line)
    plots = [str(plot_composition(n, results[n], out / "plots" / f"{n}.composition.png"))
             for n in ("phase1-uniform", "phase2-curriculum", "phase2-uniform")]
    plots.append(str(plot_rank_profiles({n: results[n] for n in ("phase2-curriculum", "phase2-uniform")},
                                        out / "plots" / "rank_profiles.png")))
    ctx.step(f"plots: {', '.join(Path(p).name for p in plots)} in {out / 'plots'}")
    cur = results["phase2-curriculum"]
    body = [s for s in cur.segments if s.name.startswith("b")]
    return {
        "spec": str(spec_path), "shards": str(shards), "sets": {n: str(shards / n) for n in results},
        "tokenizer": tok_json, "seq_len": spec.seq_len, "plots": plots,
        "n_tokens": {n: m.n_tokens for n, m in results.items()},
        "curriculum_mean_rank_first_last": [body[0].mean_rank, body[-1].mean_rank] if body else None,
        "transition": cur.extra.get("transition"),
    }


def _sample_texts(path: Path, n: int) -> list[str]:
    from purokit.component import Component

    comp = Component.open(path)
    for batch in comp.iter_batches(columns=["text"], batch_size=n):
        return [t for t in batch.column("text").to_pylist() if t]
    return []


def summary(result: dict[str, Any]) -> list[str]:
    lines = [f"mixture spec: {result['spec']}"]
    for n, p in result["sets"].items():
        lines.append(f"shard set {n}: {p} ({result['n_tokens'][n]:,} tokens)")
    if result.get("curriculum_mean_rank_first_last"):
        a, b = result["curriculum_mean_rank_first_last"]
        lines.append(f"curriculum mean rank goes from {a:.2f} (first bucket) to {b:.2f} (last)")
    lines.append(f"plots: {Path(result['plots'][-1]).parent}")
    return lines
