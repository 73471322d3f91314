"""The run summary: documents in and out per stage and source, duplicate clusters, quarantine and
filter pass rates, read from the component manifests (the only record of what a job did)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from purokit import storage
from kaiyuan.spark.components_io import list_components

STAGES = ("ingest", "dedup", "score")


def collect(output: str | Path) -> dict[str, Any]:
    """{source: {stage: counts...}} from every complete component under `output`."""
    output = storage.path(output)
    out: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        for name, c in list_components(output / stage).items():
            m = c.manifest
            entry = {"dir": str(c.directory), "n_docs": m.n_docs, "counts": m.counts,
                     "seconds": round(sum(v for k, v in m.timings_s.items()), 1)}
            out.setdefault(name, {})[stage] = entry
    return out


def _by_count(d: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))


def table_lines(summary: dict[str, Any]) -> list[str]:
    """Plain-text tables: one line per source and stage, then filter pass rates and scores."""
    lines = [f"{'source':<10} {'stage':<7} {'docs in':>9} {'docs out':>9} {'quarant.':>8} {'exact':>7} {'near':>7} "
             f"{'clusters':>8} {'largest':>7}"]
    for source in sorted(summary):
        st = summary[source]
        if "ingest" in st:
            c = st["ingest"]["counts"]
            lines.append(f"{source:<10} {'ingest':<7} {c.get('records', 0):>9} {st['ingest']['n_docs']:>9} "
                         f"{c.get('quarantined', 0):>8} {'':>7} {'':>7} {'':>8} {'':>7}")
        if "dedup" in st:
            c = st["dedup"]["counts"]
            lines.append(f"{source:<10} {'dedup':<7} {c.get('docs_in', 0):>9} {st['dedup']['n_docs']:>9} {'':>8} "
                         f"{c.get('removed_exact', 0):>7} {c.get('removed_near', 0):>7} {c.get('clusters', 0):>8} "
                         f"{c.get('largest_cluster', 0):>7}")
        if "score" in st:
            lines.append(f"{source:<10} {'score':<7} {st['score']['counts'].get('docs', 0):>9} {st['score']['n_docs']:>9}")
    lines += _per_source(summary, "ingest", "quarantine_reasons", "quarantine reasons:")
    lines += _score_table(summary, "filters", f"{'source':<10} {'filter':<20} {'pass rate':>9}  top reasons", _filter_line)
    lines += _score_table(summary, "scores", f"{'source':<10} {'score':<20} {'mean':>6} {'p10':>6} {'p50':>6} {'p90':>6}",
                          _score_line)
    lines += _per_source(summary, "score", "languages", "languages (top 3):", top=3)
    return lines


def _score_table(summary: dict, key: str, header: str, line: Any) -> list[str]:
    """A header and one `line(source, name, stats)` per source and entry of the score stage's `counts[key]`."""
    rows = [line(s, f, v) for s, st in sorted(summary.items()) if "score" in st
            for f, v in sorted(st["score"]["counts"].get(key, {}).items())]
    return ["", header] + rows if rows else []


def _filter_line(s: str, f: str, v: dict) -> str:
    rate = "" if v.get("pass_rate") is None else f"{100 * v['pass_rate']:.1f}%"
    top = ", ".join(f"{k} {n}" for k, n in _by_count(v.get("top_reasons", {}))[:3])
    return f"{s:<10} {f:<20} {rate:>9}  {top}"


def _score_line(s: str, f: str, v: dict) -> str:
    q = v.get("quantiles", {})
    return (f"{s:<10} {'quality.' + f:<20} {v['mean']:>6.3f} {q.get('p10', 0):>6.3f} {q.get('p50', 0):>6.3f} "
            f"{q.get('p90', 0):>6.3f}")


def _per_source(summary: dict, stage: str, key: str, heading: str, top: int | None = None) -> list[str]:
    """A heading and one line per source of a stage's `counts[key]` mapping (its `top` largest)."""
    found = {s: st[stage]["counts"][key] for s, st in summary.items() if stage in st and st[stage]["counts"].get(key)}
    if not found:
        return []
    return ["", heading] + [f"  {s:<10} " + ", ".join(f"{k} {v}" for k, v in
                                                     (_by_count(found[s])[:top] if top else found[s].items()))
                            for s in sorted(found)]
