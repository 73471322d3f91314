"""Demo stage "kaiyuan": the corpus stage's raw sources -> scored components, through spark-submit.

1. `python -m kaiyuan train-classifier`: a fastText quality classifier ("hq") from the corpus
   stage's labelled data (documentation prose vs boilerplate and junk); held-out metrics printed.
2. `spark-submit kaiyuan/jobs/pipeline.py --config run.yaml`: ingest (parquet, jsonl, jsonl.gz,
   jsonl.zst, with the bad records quarantined), exact + MinHash-LSH dedup within each source,
   and scoring: language id on every source; datatrove's Gopher, C4 and FineWeb filters and the
   `quality.hq` classifier on `prose` (the web-like source; its score is what the proxy and
   mixtures stages slice and order by). One Spark application, so the JVM starts once.
3. A summary table from the manifests, and how many of the corpus stage's planted duplicates
   the dedup found.

The result names the scored component directory of each source (`components`), which later
stages read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def run_config(ctx, corpus: dict[str, Any], model: Path, out: Path) -> dict[str, Any]:
    return {
        "output": str(out),
        "spark": {"log_level": "WARN"},
        "sources": [
            {"name": "code", "paths": [corpus["sources"]["code"]], "text_field": "content", "id_field": "path",
             "license": "PSF-2.0", "source_identifier": "python-stdlib"},
            {"name": "prose", "paths": [corpus["sources"]["prose"]], "id_field": "id",
             "source_identifier": "local-docs"},
            {"name": "math", "paths": [corpus["sources"]["math"]], "id_field": "id",
             "source_identifier": "generated-arithmetic"},
        ],
        "ingest": {"max_text_bytes": 1 << 20},
        "dedup": {"scope": "source", "minhash": {"n_grams": 5, "bands": 14, "rows": 8}},
        "score": {
            "rows_per_partition": 1000,
            "annotators": [
                {"type": "lid"},
                {"type": "datatrove", "filter": "gopher_quality", "sources": ["prose"]},
                {"type": "datatrove", "filter": "gopher_repetition", "sources": ["prose"]},
                {"type": "datatrove", "filter": "c4_quality", "sources": ["prose"],
                 "kwargs": {"filter_no_terminal_punct": False}},
                {"type": "datatrove", "filter": "fineweb_quality", "sources": ["prose"]},
                {"type": "fasttext", "name": "hq", "model": str(model), "sources": ["prose"]},
            ],
        },
    }


def classifier_config(corpus: dict[str, Any], model: Path) -> dict[str, Any]:
    return {
        "name": "hq",
        "output": str(model),
        "positives": [{"paths": [corpus["labelled"]["positives"]]}],
        "negatives": [{"paths": [corpus["labelled"]["negatives"]]}],
        "heldout_fraction": 0.15,
        "fasttext": {"dim": 32, "epoch": 15, "lr": 0.3, "word_ngrams": 2, "bucket": 50_000},
        "seed": 0,
    }


def _stream(ctx, cmd: list[str], log_path: Path, keep: tuple[str, ...]) -> None:
    """Run a command, write its whole output to `log_path`, show our own progress lines."""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ctx.env(),
                                cwd=REPO)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if any(k in line for k in keep):
                ctx.step(line.rstrip().split(" INFO ", 1)[-1][:160])
        rc = proc.wait()
    if rc != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({rc}); log: {log_path}\n{tail}")


def planted_recall(planted_file: Path, dedup_dir: Path) -> dict[str, Any]:
    """How many planted copies the dedup removed, and how many originals it kept."""
    import pyarrow.parquet as pq

    from purokit.component import Component

    groups = json.loads(planted_file.read_text())["groups"]
    removed: dict[str, set[str]] = {}
    kept: dict[str, set[str]] = {}
    for source in {g["source"] for g in groups}:
        d = dedup_dir / source
        removed[source] = set(pq.read_table(d / "_removed", columns=["id"]).column("id").to_pylist()) \
            if (d / "_removed").is_dir() else set()
        kept[source] = set(Component.open(d).read(columns=["id"]).column("id").to_pylist())
    copies = [(g["source"], c) for g in groups for c in g["copies"]]
    found = sum(c in removed[s] for s, c in copies)
    originals_kept = sum(g["original"] in kept[g["source"]] for g in groups)
    return {"planted_copies": len(copies), "copies_removed": found, "groups": len(groups),
            "originals_kept": originals_kept}


def run(ctx) -> dict[str, Any]:
    from purokit import atomic
    from kaiyuan import report

    corpus = ctx.result("corpus")
    out = ctx.stage_dir()
    model = out / "models" / "hq.bin"
    atomic.write_text(out / "classifier.yaml", yaml.safe_dump(classifier_config(corpus, model), sort_keys=False))
    ctx.step("train-classifier 'hq' (documentation prose vs boilerplate and junk)")
    _stream(ctx, [sys.executable, "-m", "kaiyuan", "train-classifier", "--config", str(out / "classifier.yaml")],
            out / "train-classifier.log", keep=("held-out", "model "))
    run_dir = out                          # components under <stage>/{ingest,dedup,score}/<source>
    cfg_path = out / "run.yaml"
    atomic.write_text(cfg_path, yaml.safe_dump(run_config(ctx, corpus, model, run_dir), sort_keys=False))
    cmd = ["spark-submit", "--master", "local[2]", "--driver-memory", "2g",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
           str(REPO / "kaiyuan" / "jobs" / "pipeline.py"), "--config", str(cfg_path)]
    ctx.step("spark-submit kaiyuan/jobs/pipeline.py (ingest -> dedup -> score)")
    _stream(ctx, cmd, out / "pipeline.log",
            keep=("kaiyuan.ingest: ingest ", "kaiyuan.dedup: dedup ", "kaiyuan.score: score ", "pipeline finished"))
    summary = report.collect(run_dir)
    for line in report.table_lines(summary):
        ctx.step(line)
    recall = planted_recall(Path(corpus["planted"]), run_dir / "dedup")
    ctx.step(f"planted duplicates removed: {recall['copies_removed']}/{recall['planted_copies']} copies; "
             f"originals kept: {recall['originals_kept']}/{recall['groups']}")
    card = json.loads((model.parent / (model.name + ".json")).read_text())
    components = {name: st["score"]["dir"] for name, st in sorted(summary.items()) if "score" in st}
    return {
        "components": components,
        "run_config": str(cfg_path),
        "classifier": {"model": str(model), "metrics": card["metrics"]},
        "planted": recall,
        "eval_files": corpus["eval"],
        "counts": {name: {stage: {"n_docs": st[stage]["n_docs"]} for stage in st} for name, st in summary.items()},
        "table": report.table_lines(summary),
    }


def summary(result: dict[str, Any]) -> list[str]:
    lines = [f"{n}: {p}" for n, p in result["components"].items()]
    m = result["classifier"]["metrics"]
    lines.append(f"quality classifier 'hq': held-out precision {m.get('precision', 0):.2f}, recall {m.get('recall', 0):.2f}, "
                 f"AUC {m.get('roc_auc', 0):.2f}")
    p = result["planted"]
    lines.append(f"planted duplicate copies removed: {p['copies_removed']}/{p['planted_copies']}")
    lines.append(f"run config: {result['run_config']}")
    return lines
