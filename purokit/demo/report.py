"""`python -m purokit.demo.report RUN_DIR [--out report.html]`: one self-contained HTML page (images
embedded) that a person can read, built from any demo run directory.

Sections: data (dedup and filter statistics per source), proxy experiments (profile table and PCA
biplot), mixtures (bucket composition and mean-rank plots, curriculum vs uniform), training
(LR and loss curves of UD, CD and CMA on one plot, held-out losses, the averaged model), synthetic
data (acceptance per stage) and SFT. A stage that has not run gets a line saying so.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import json
import sys
from pathlib import Path
from typing import Any, Iterable

from purokit import atomic

STAGE_FILE = "stage.json"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1d1d1f;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{border-bottom:2px solid #e5e5ea;padding-bottom:.2em;margin-top:2em}
h3{margin-bottom:.3em} .muted{color:#6e6e73} .missing{color:#b3261e}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.92em} th,td{padding:.3em .7em;border-bottom:1px solid #e5e5ea;
text-align:right} th{background:#f5f5f7} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #e5e5ea;margin:.4em 0} .grid{display:grid;grid-template-columns:1fr 1fr;gap:1em}
code{background:#f5f5f7;padding:0 .25em;border-radius:3px} nav a{margin-right:1em}
"""


# ---- building blocks -------------------------------------------------------------------------------

def esc(x: Any) -> str:
    return html.escape(str(x))


def fmt(x: Any, digits: int = 4) -> str:
    if isinstance(x, bool) or x is None:
        return "–" if x is None else str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e-3 or abs(x) >= 1e5 else f"{x:,.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def table(header: list[str], rows: Iterable[Iterable[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def image(path: str | Path | None, caption: str) -> str:
    """Embed a PNG as a data URI (the page stays one file)."""
    if not path or not Path(path).is_file():
        return f'<p class="missing">missing image: {esc(path)}</p>'
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{data}"><figcaption class="muted">{esc(caption)}</figcaption></figure>'


def load_results(run_dir: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for f in sorted(run_dir.glob(f"*/{STAGE_FILE}")):
        rec = json.loads(f.read_text(encoding="utf-8"))
        out[f.parent.name] = {"result": rec.get("result", {}), "elapsed_s": rec.get("elapsed_s"), "profile": rec.get("profile")}
    return out


def _read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# ---- sections ---------------------------------------------------------------------------------------

def section_data(res: dict[str, Any], run_dir: Path) -> str:
    summary_path = run_dir / "kaiyuan" / "summary.json"
    if not summary_path.is_file():
        return "<p class='missing'>kaiyuan summary.json not found</p>"
    summary = _read_json(summary_path)
    rows, filt, scores = [], [], []
    for source, stages in sorted(summary.items()):
        ing, ded, sco = stages.get("ingest", {}).get("counts", {}), stages.get("dedup", {}).get("counts", {}), stages.get("score", {}).get("counts", {})
        rows.append([source, ing.get("records"), ing.get("quarantined"), ing.get("documents"), ded.get("removed_exact"),
                     ded.get("removed_near"), ded.get("clusters"), ded.get("largest_cluster"), ded.get("docs_out")])
        for name, f in sorted(sco.get("filters", {}).items()):
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(f.get("top_reasons", {}).items(), key=lambda kv: -kv[1])[:3])
            filt.append([source, name, f"{100 * f.get('pass_rate', 0):.1f}%", f.get("pass"), f.get("fail"), reasons])
        for name, s in sorted(sco.get("scores", {}).items()):
            q = s.get("quantiles", {})
            scores.append([source, f"quality.{name}", s.get("mean"), q.get("p10"), q.get("p50"), q.get("p90")])
    quarantine = {s: st.get("ingest", {}).get("counts", {}).get("quarantine_reasons", {}) for s, st in summary.items()}
    parts = [table(["source", "records", "quarantined", "ingested", "exact dups removed", "near dups removed",
                    "clusters", "largest cluster", "docs out"], rows)]
    q_lines = [f"<li><b>{esc(s)}</b>: " + esc(", ".join(f"{k} {v}" for k, v in sorted(r.items()))) + "</li>"
               for s, r in sorted(quarantine.items()) if r]
    if q_lines:
        parts.append("<p>Quarantined with a reason (never silently dropped):</p><ul>" + "".join(q_lines) + "</ul>")
    planted = res.get("planted")
    if planted:
        parts.append(f"<p>Planted near-duplicates: {fmt(planted.get('planted_copies'))} copies in "
                     f"{fmt(planted.get('groups'))} groups; {fmt(planted.get('copies_removed'))} removed, "
                     f"{fmt(planted.get('originals_kept'))} originals kept.</p>")
    if filt:
        parts.append("<h3>Quality annotation (datatrove filters; annotate, never drop)</h3>")
        parts.append(table(["source", "filter", "pass rate", "pass", "fail", "top reasons"], filt))
    if scores:
        parts.append("<h3>Scores</h3>" + table(["source", "score", "mean", "p10", "p50", "p90"], scores))
    clf = res.get("classifier", {}).get("metrics")
    if clf:
        parts.append("<p>fastText quality classifier, held-out: " + esc(", ".join(
            f"{k} {fmt(clf[k], 3)}" for k in ("precision", "recall", "f1", "roc_auc") if k in clf)) + "</p>")
    return "".join(parts)


def section_proxy(res: dict[str, Any]) -> str:
    parts = []
    csv_path = res.get("profile_csv")
    if csv_path and Path(csv_path).is_file():
        with open(csv_path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        if rows:
            body = [[c if i == 0 else (float(c) if c not in ("", None) and _is_number(c) else c) for i, c in enumerate(r)]
                    for r in rows[1:]]
            parts.append(table(rows[0], body))
    parts.append(f"<p>Best slice by average: <b>{esc(res.get('best_slice'))}</b>. Explained variance of the PCA: "
                 f"{esc(', '.join(fmt(x, 3) for x in res.get('explained_variance', [])))}. Kept fraction of the scored "
                 f"source: {esc(res.get('keep_fraction'))}. Suggested weights: "
                 f"{esc(', '.join(f'{k} {v:.3f}' for k, v in (res.get('weights') or {}).items()))} "
                 f"(draft spec <code>{esc(res.get('suggested_mixture'))}</code>).</p>")
    parts.append(image(res.get("biplot"), "PCA biplot of the capability profiles (z-scored)"))
    return "".join(parts)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def section_mixtures(res: dict[str, Any]) -> str:
    parts = [table(["shard set", "tokens"], sorted((k, v) for k, v in res.get("n_tokens", {}).items()))]
    first_last = res.get("curriculum_mean_rank_first_last")
    if first_last:
        parts.append(f"<p>Curriculum: the token-weighted mean within-component rank goes from {first_last[0]:.2f} in the "
                     f"first bucket to {first_last[1]:.2f} in the last; the uniform stream stays near 0.5.</p>")
    tr = res.get("transition")
    if tr:
        parts.append(f"<p>Phase transition from {esc(tr.get('from_phase'))}: {fmt(tr.get('transition_tokens'))} tokens "
                     f"({fmt(tr.get('replay_tokens'))} replay, {fmt(tr.get('phase_tokens'))} new phase).</p>")
    plots = [p for p in res.get("plots", []) if str(p).endswith(".png")]
    parts.append("<div class='grid'>" + "".join(image(p, Path(p).stem.replace(".", " ")) for p in plots) + "</div>")
    parts.append(f"<p class='muted'>Spec: <code>{esc(res.get('spec'))}</code></p>")
    return "".join(parts)


def section_trainer(res: dict[str, Any], sft: dict[str, Any] | None) -> str:
    h = res.get("held_out_loss", {})
    labels = {"phase1": "phase 1 checkpoint", "UD": "UD (uniform, decay)", "CD": "CD (curriculum, decay)",
              "CDC": "CDC (curriculum, decay, constant continuation: endpoint)",
              "CMA": "CMA (CDC + average of the last 6 checkpoints)"}
    parts = [table(["model", "held-out loss"], [(labels[k], h[k]) for k in labels if k in h])]
    parts.append(image(res.get("plot"), "learning rate and loss of UD, CD and CMA from the same phase-1 checkpoint"))
    check = res.get("export_check", {})
    if res.get("export"):
        parts.append(f"<p>The CMA average exported to Hugging Face format (<code>{esc(res['export'])}</code>) loads back as "
                     f"{esc(check.get('class'))}; max |logit difference| vs the trainer {fmt(check.get('max_logit_diff'), 2)}.</p>")
    if sft:
        parts.append("<h3>SFT of the CMA model on the synthetic data</h3>")
        parts.append(table(["", "value"], [
            ("SFT conversations (train / held-out)", f"{sft['records']['train']} / {sft['records']['eval']}"),
            ("held-out SFT loss before", sft.get("eval_loss_before")),
            ("held-out SFT loss after", sft.get("eval_loss_after")),
        ]))
    return "".join(parts)


def _acceptance_rows(res: dict[str, Any]) -> list[list[Any]]:
    """One row per step, in pipeline order where the stage recorded it (stage.json sorts keys)."""
    acc = res.get("acceptance", {})
    order = [s for s in res.get("step_order") or [] if s in acc] + sorted(set(acc) - set(res.get("step_order") or []))
    return [[step, acc[step].get("in"), acc[step].get("out"),
             "–" if acc[step].get("acceptance") is None else f"{100 * acc[step]['acceptance']:.0f}%"] for step in order]


def section_synth(synth: dict[str, Any] | None, domains: dict[str, Any] | None) -> str:
    parts = []
    if synth:
        parts.append(f"<h3>Reasoning on/off pairs</h3><p>{fmt(synth.get('n_records'))} SFT records, "
                     f"{fmt(synth.get('n_strict_pairs'))} strict pairs from {fmt(synth.get('n_prompts'))} prompts "
                     f"({esc(synth.get('problems_from'))}); teacher {esc(synth.get('teacher', {}).get('engine'))}.</p>")
        parts.append(table(["step", "in", "out", "acceptance"], _acceptance_rows(synth)))
    for name, r in (domains or {}).items():
        if not isinstance(r, dict) or "acceptance" not in r:
            continue
        parts.append(f"<h3>{esc(name)}</h3><p>{fmt(r.get('n_records'))} records from {fmt(r.get('n_prompts'))} prompts "
                     f"(rejections with reasons: <code>{esc(r.get('rejects'))}</code>).</p>")
        parts.append(table(["stage", "in", "out", "acceptance"], _acceptance_rows(r)))
    return "".join(parts) or "<p class='missing'>no synthetic-data stage has run</p>"


# ---- the page ---------------------------------------------------------------------------------------

SECTIONS = [
    ("data", "Data: ingest, dedup and quality annotation (kaiyuan)", ("kaiyuan",)),
    ("proxy", "Proxy experiments: profiles and PCA (proxy_eval)", ("proxy",)),
    ("mixtures", "Mixture: curriculum and uniform shard sets (mixtures)", ("mixtures",)),
    ("training", "Training: phase 1, then UD, CD and CMA (trainer)", ("trainer",)),
    ("synth", "Synthetic data: acceptance per stage (synth)", ("synth", "synth_domains")),
]


def build_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    run_dir = Path(run_dir).resolve()
    stages = load_results(run_dir)
    if not stages:
        raise FileNotFoundError(f"{run_dir}: no finished demo stage here (no */{STAGE_FILE})")
    r = {name: s["result"] for name, s in stages.items()}
    body: list[str] = []
    for key, title, needs in SECTIONS:
        body.append(f"<h2 id='{key}'>{esc(title)}</h2>")
        if not any(n in r for n in needs):
            body.append(f"<p class='missing'>stage {esc(' / '.join(needs))} has not run in this directory</p>")
            continue
        if key == "data":
            body.append(section_data(r["kaiyuan"], run_dir))
        elif key == "proxy":
            body.append(section_proxy(r["proxy"]))
        elif key == "mixtures":
            body.append(section_mixtures(r["mixtures"]))
        elif key == "training":
            body.append(section_trainer(r["trainer"], r.get("sft")))
        elif key == "synth":
            body.append(section_synth(r.get("synth"), r.get("synth_domains")))
    from purokit.demo.stages import STAGES

    ran = [n for n, _ in STAGES if n in stages] + sorted(set(stages) - {n for n, _ in STAGES})
    total = sum(stages[n].get("elapsed_s") or 0.0 for n in ran)
    timing = table(["stage", "seconds"], [(n, stages[n].get("elapsed_s")) for n in ran] + [("total", round(total, 1))])
    profile = next(iter(stages.values())).get("profile")
    nav = "".join(f"<a href='#{k}'>{esc(k)}</a>" for k, _, _ in SECTIONS)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>purokit demo report</title><style>{CSS}</style></head>"
            f"<body><h1>purokit: the Puro recipe end to end</h1><p class='muted'>run directory <code>{esc(run_dir)}</code>, "
            f"profile <code>{esc(profile)}</code></p><nav>{nav}</nav>{''.join(body)}"
            f"<h2>Stage timings</h2>{timing}</body></html>")
    out = Path(out) if out else run_dir / "report.html"
    atomic.write_text(out, page)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m purokit.demo.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report.html")
    args = ap.parse_args(argv)
    print(build_report(args.run_dir, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
