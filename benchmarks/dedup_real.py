"""Real-text dedup benchmark: kaiyuan vs datatrove vs datasketch + exact verification, same run.

    make datatrove-env      # datatrove in .venv-datatrove, installed as its users install it
    .venv/bin/python benchmarks/dedup_real.py --out benchmarks/_work/dedup_real.json

1. Corpus and exact ground truth: `benchmarks/dedup_real_truth.py` (text installed on this
   machine, five sources, ~18k documents; every pair with word-5-gram Jaccard >= t found exactly;
   removed-set precision/recall against the components of the true edges). Cached in `--work`.
2. kaiyuan, as users run it: `spark-submit --master local[2] kaiyuan/jobs/ingest.py` then
   `.../dedup.py` with the default config (dedup.threshold 0.7, verification on), then the dedup
   again with `dedup.threshold=0.8`, and with `dedup.verify.enabled=false` (LSH alone, same bands:
   the cost of verification: the dedup stage wall, i.e. the sum of the job's stage timings, and
   the job's wall, default over LSH alone). End to end = ingest + dedup wall time.
3. datatrove (.venv-datatrove): FineWeb's MinHash settings (5-grams, 14 buckets x 8 hashes,
   sha1 64-bit), MinhashDedupSignature -> Buckets -> Cluster -> Filter, LocalPipelineExecutor with
   2 workers, reading the same jsonl and writing jsonl, one pipeline per source (kaiyuan's
   default scope). Its removals are scored at t = 0.7 and t = 0.8.
4. datasketch + exact verification, in this process: kaiyuan's word 5-grams, MinHash(num_perm=112)
   per document, MinHashLSH(threshold=t) (datasketch's own bands x rows), every candidate verified
   by the exact Jaccard of the shingle sets, union-find, the smallest id kept.

Every system is scored with `dedup_real_truth.score` per source and overall. Wall times, CPU
seconds of the process tree and the load average are recorded (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import dedup_real_truth as truth_mod  # noqa: E402
from dedup_bench import measure, spark_env, spark_submit  # noqa: E402

THRESHOLDS = (0.7, 0.8)
DATATROVE_PY = REPO / ".venv-datatrove" / "bin" / "python"

DATATROVE_SCRIPT = r'''
import json, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig

if __name__ == "__main__":
    sources, work = json.loads(sys.argv[1]), sys.argv[2]
    # FineWeb's settings (datatrove examples/fineweb.py)
    cfg = MinhashConfig(hash_config=HashConfig(hash_fc="sha1", precision=64), num_buckets=14, hashes_per_bucket=8, n_grams=5)
    for name, folder in sources.items():
        w = f"{work}/{name}"
        reader = lambda: JsonlReader(folder, glob_pattern="*.jsonl", text_key="text", id_key="id")
        s1 = LocalPipelineExecutor(pipeline=[reader(), MinhashDedupSignature(output_folder=f"{w}/sigs", config=cfg)],
                                   tasks=2, workers=2, logging_dir=f"{w}/logs/sigs")
        s2 = LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(input_folder=f"{w}/sigs", output_folder=f"{w}/buckets", config=cfg)],
                                   tasks=cfg.num_buckets, workers=2, logging_dir=f"{w}/logs/buckets", depends=s1)
        s3 = LocalPipelineExecutor(pipeline=[MinhashDedupCluster(input_folder=f"{w}/buckets", output_folder=f"{w}/remove_ids", config=cfg)],
                                   tasks=1, logging_dir=f"{w}/logs/clusters", depends=s2)
        s4 = LocalPipelineExecutor(pipeline=[reader(), MinhashDedupFilter(input_folder=f"{w}/remove_ids",
                                                                          exclusion_writer=JsonlWriter(f"{w}/removed")),
                                             JsonlWriter(f"{w}/output")],
                                   tasks=2, workers=2, logging_dir=f"{w}/logs/filter", depends=s3)
        s4.run()
'''


# ---- ground truth (cached) -------------------------------------------------------------------

def load_truth(work: Path) -> tuple[dict, dict]:
    corpus = truth_mod.build_corpus(work / "corpus")
    cache = work / "truth.json"
    if cache.is_file():
        raw = json.loads(cache.read_text())
    else:
        raw = {}
        for source, files in corpus["files"].items():
            t0 = time.perf_counter()
            ids, texts = truth_mod.read_source(files)
            tr = truth_mod.source_truth(ids, texts, THRESHOLDS)
            raw[source] = {"ids": ids, "seconds": round(time.perf_counter() - t0, 1),
                           **{str(t): {**{k: v for k, v in x.items() if k != "roots"}, "roots": x["roots"].tolist()}
                              for t, x in tr.items()}}
            print(f"truth {source}: {len(ids)} docs, {raw[source]['seconds']}s", flush=True)
        cache.write_text(json.dumps(raw))
    return corpus, raw


def score_all(truth: dict, removed: dict[str, set[str]], t: float) -> dict:
    per = {}
    for source, tr in truth.items():
        per[source] = truth_mod.score(tr["ids"], np.array(tr[str(t)]["roots"]), removed.get(source, set()))
    tot = {k: sum(p[k] for p in per.values()) for k in ("removed", "ideal", "tp")}
    tot["precision"] = round(tot["tp"] / tot["removed"], 4) if tot["removed"] else 1.0
    tot["recall"] = round(tot["tp"] / tot["ideal"], 4) if tot["ideal"] else 1.0
    return {"overall": tot, "per_source": per}


# ---- kaiyuan ---------------------------------------------------------------------------------

def kaiyuan_config(work: Path, corpus: dict) -> Path:
    import yaml

    cfg = {"output": str(work / "kaiyuan"),
           "sources": [{"name": s, "paths": [str(Path(f[0]).parent)], "id_field": "id"} for s, f in corpus["files"].items()],
           "ingest": {"fingerprint": "size-mtime"}}
    path = work / "kaiyuan.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def kaiyuan_removed(dedup_dir: Path, sources) -> dict[str, set[str]]:
    import pyarrow.parquet as pq

    out = {}
    for s in sources:
        d = dedup_dir / s / "_removed"
        out[s] = set(pq.read_table(d, columns=["id"]).column("id").to_pylist()) if d.is_dir() else set()
    return out


VARIANTS = {"default": [], "t0.8": ["dedup.threshold=0.8"], "lsh_only": ["dedup.verify.enabled=false"]}
VERIFY_STAGES = ("candidates", "verify_sets", "verify")      # with verification; LSH alone has "candidates" only


def job_timings(manifests) -> dict[str, float]:
    """One dedup job's stage timings: each source's manifest has the stages up to its own write."""
    out: dict[str, float] = {}
    for m in manifests:
        out.update(m.timings_s)
    return out


def stage_seconds(timings: dict[str, float]) -> dict[str, float]:
    """A dedup manifest's stage timings summed: every stage (the dedup stage wall, without the
    JVM start), the writes, and the pair stages (candidates and, when on, verification)."""
    writes = sum(v for k, v in timings.items() if k.startswith("write."))
    total = sum(timings.values())
    return {"stages_s": round(total, 1), "writes_s": round(writes, 1),
            "pairs_s": round(sum(timings.get(k, 0.0) for k in VERIFY_STAGES), 1)}


def verify_overhead(default: dict, lsh_only: dict) -> dict:
    """Cost of exact verification over LSH alone (same bands): ratios of the dedup stage wall
    (sum of the stage timings), of the dedup job's wall and CPU seconds (JVM start included)."""
    a, b = default["stages"], lsh_only["stages"]
    return {"stages_s": [a["stages_s"], b["stages_s"]], "stages": round(a["stages_s"] / b["stages_s"] - 1, 3),
            "pair_stages_s": [a["pairs_s"], b["pairs_s"]],
            "job_wall_s": [default["wall_s"], lsh_only["wall_s"]], "job_wall": round(default["wall_s"] / lsh_only["wall_s"] - 1, 3),
            "job_cpu": round(default["cpu_s"] / lsh_only["cpu_s"] - 1, 3)}


def run_kaiyuan(work: Path, corpus: dict, truth: dict, driver_memory: str, names=tuple(VARIANTS), reuse_ingest: bool = False) -> dict:
    from purokit.component import Component

    cfg = kaiyuan_config(work, corpus)
    env = spark_env()
    if reuse_ingest and (work / "kaiyuan-ingest.json").is_file():
        res = {"ingest": json.loads((work / "kaiyuan-ingest.json").read_text())}
    else:
        shutil.rmtree(work / "kaiyuan", ignore_errors=True)
        res = {"ingest": measure(spark_submit("ingest", cfg, driver_memory), env, work, work / "kaiyuan-ingest.log")}
        (work / "kaiyuan-ingest.json").write_text(json.dumps(res["ingest"]))
    variants = {k: v for k, v in VARIANTS.items() if k in names}
    ingest_dir = work / "kaiyuan" / "ingest"
    for name, overrides in variants.items():
        out = work / f"kaiyuan-{name}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = spark_submit("dedup", cfg, driver_memory) + [f"output={out}", f"dedup.input_dir={ingest_dir}", *overrides]
        r = measure(cmd, env, work, work / f"kaiyuan-dedup-{name}.log")
        comp = {s: Component.open(out / "dedup" / s).manifest for s in corpus["files"]}
        m = next(iter(comp.values()))
        r["resolved"] = m.config.get("resolved") if isinstance(m.config, dict) else None
        r["timings_s"] = job_timings(comp.values())
        r["stages"] = stage_seconds(r["timings_s"])
        r["counts"] = {s: c.counts for s, c in comp.items()}
        removed = kaiyuan_removed(out / "dedup", corpus["files"])
        r["quality"] = {str(t): score_all(truth, removed, t) for t in THRESHOLDS}
        res[name] = r
        print(f"kaiyuan {name}: dedup {r['wall_s']}s, stages {r['stages']}", {t: q["overall"] for t, q in r["quality"].items()},
              flush=True)
    if "default" in res:
        res["end_to_end_s"] = round(res["ingest"]["wall_s"] + res["default"]["wall_s"], 1)
        res["end_to_end_cpu_s"] = round(res["ingest"]["cpu_s"] + res["default"]["cpu_s"], 1)
        res["docs_per_s"] = round(corpus["n_docs"] / res["end_to_end_s"], 1)
    if "default" in res and "lsh_only" in res:
        res["verify_overhead"] = verify_overhead(res["default"], res["lsh_only"])
        print("verification overhead:", res["verify_overhead"], flush=True)
    return res


# ---- datatrove -------------------------------------------------------------------------------

def run_datatrove(work: Path, corpus: dict, truth: dict) -> dict:
    import gzip

    dt = work / "datatrove"
    shutil.rmtree(dt, ignore_errors=True)
    dt.mkdir(parents=True)
    script = work / "datatrove_minhash.py"
    script.write_text(DATATROVE_SCRIPT)
    folders = {s: str(Path(f[0]).parent) for s, f in corpus["files"].items()}
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    res = measure([str(DATATROVE_PY), str(script), json.dumps(folders), str(dt)], env, work, work / "datatrove.log")
    removed = {}
    for s in folders:
        ids = set()
        for p in sorted((dt / s / "removed").glob("*.jsonl*")):
            with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as fh:
                ids.update(json.loads(line)["id"] for line in fh)
        removed[s] = ids
    res["docs_per_s"] = round(corpus["n_docs"] / res["wall_s"], 1)
    res["quality"] = {str(t): score_all(truth, removed, t) for t in THRESHOLDS}
    print(f"datatrove: {res['wall_s']}s", {t: q["overall"] for t, q in res["quality"].items()}, flush=True)
    return res


# ---- datasketch + exact verification ---------------------------------------------------------

def run_datasketch(corpus: dict, truth: dict, num_perm: int = 112) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc
    from datasketch import MinHash, MinHashLSH

    from kaiyuan import minhash as mh

    res = {}
    t_start = time.perf_counter()
    c_start = time.process_time()
    prepared = {}
    for source, files in corpus["files"].items():
        ids, texts = truth_mod.read_source(files)
        words = pc.split_pattern_regex(mh.normalize_for_shingles(pa.array(texts)), mh._SEPARATORS).to_pylist()
        sets, sigs = [], []
        for w in words:
            w = [x for x in w if x]
            grams = {" ".join(w[i:i + 5]) for i in range(len(w) - 4)} if len(w) >= 5 else ({" ".join(w)} if w else set())
            sets.append(grams)
            m = MinHash(num_perm=num_perm)
            m.update_batch([g.encode("utf-8") for g in grams])
            sigs.append(m)
        prepared[source] = (ids, sets, sigs)
    res["signatures_s"] = round(time.perf_counter() - t_start, 1)
    for t in THRESHOLDS:
        t0 = time.perf_counter()
        removed = {}
        for source, (ids, sets, sigs) in prepared.items():
            lsh = MinHashLSH(threshold=t, num_perm=num_perm)
            for i, (s, m) in enumerate(zip(sets, sigs)):
                if s:
                    lsh.insert(i, m)
            edges = []
            for i, (s, m) in enumerate(zip(sets, sigs)):
                if not s:
                    continue
                for j in lsh.query(m):
                    if j > i and mh.exact_jaccard(s, sets[j]) >= t:
                        edges.append((i, j, 1.0))
            roots = truth_mod.components(len(ids), edges)
            removed[source] = {ids[i] for i in np.flatnonzero(roots != np.arange(len(ids)))}
        res[str(t)] = {"lsh_verify_s": round(time.perf_counter() - t0, 1), "quality": score_all(truth, removed, t),
                       "bands_rows": [lsh.b, lsh.r]}
        if t == THRESHOLDS[0]:
            res["end_to_end_s"] = round(time.perf_counter() - t_start, 1)
            res["end_to_end_cpu_s"] = round(time.process_time() - c_start, 1)
        print(f"datasketch t={t}:", res[str(t)]["quality"]["overall"], flush=True)
    res["docs_per_s"] = round(corpus["n_docs"] / res["end_to_end_s"], 1)
    return res


# ---- main ------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / "benchmarks" / "_work" / "dedup_real")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--systems", default="kaiyuan,datatrove,datasketch")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="kaiyuan dedup runs: " + ", ".join(VARIANTS))
    ap.add_argument("--reuse-ingest", action="store_true", help="keep the kaiyuan ingest (and its timing) of an earlier run")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    systems = set(args.systems.split(","))
    results: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "cores": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": os.getloadavg()}
    corpus, truth = load_truth(args.work)
    results["corpus"] = {"docs": corpus["docs"], "n_docs": corpus["n_docs"],
                         "mb": round(sum(os.path.getsize(f) for fs in corpus["files"].values() for f in fs) / 1e6, 1),
                         "truth": {s: {str(t): {k: v for k, v in tr[str(t)].items() if k != "roots"} for t in THRESHOLDS}
                                   for s, tr in truth.items()}}
    print("corpus:", results["corpus"]["docs"], results["corpus"]["mb"], "MB", flush=True)
    if "kaiyuan" in systems:
        results["kaiyuan"] = run_kaiyuan(args.work, corpus, truth, args.driver_memory, args.variants.split(","), args.reuse_ingest)
    if "datatrove" in systems:
        results["datatrove"] = run_datatrove(args.work, corpus, truth)
    if "datasketch" in systems:
        results["datasketch"] = run_datasketch(corpus, truth)
    if "end_to_end_s" in results.get("kaiyuan", {}):
        for peer in ("datatrove", "datasketch"):
            if peer in results:
                key = "wall_s" if peer == "datatrove" else "end_to_end_s"
                results[f"ratio_vs_{peer}"] = round(results[peer][key] / results["kaiyuan"]["end_to_end_s"], 2)
    results["load_end"] = os.getloadavg()
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
