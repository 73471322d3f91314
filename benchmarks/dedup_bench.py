"""Dedup speed benchmark on planted duplicates: kaiyuan's Spark dedup vs datatrove's 4-stage MinHash.
(Quality on real text, against exact ground truth: benchmarks/dedup_real.py. The planted pairs
here measure speed at scale and the S-curve; they are not what users' corpora look like.)

    .venv/bin/python benchmarks/dedup_bench.py --docs 200000 --scale 4

1. Corpus: `--docs` documents of ~2 KB of random words (a 30k-word Zipf vocabulary, so unrelated
   documents share no 5-grams), of which `--dup-fraction` are planted as near-duplicate pairs
   with target word-5-gram Jaccard in {0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0}; the exact
   Jaccard of every pair is measured and kept as the ground truth.
2. kaiyuan end to end: `spark-submit --master local[2] kaiyuan/jobs/ingest.py` (jsonl -> a
   component) then `.../dedup.py` with the default config (dedup.threshold 0.7: 18 bands x 6
   rows, exact verification of every candidate) except exact dedup off (datatrove has none).
3. datatrove end to end (in .venv-datatrove when `make datatrove-env` built it): JsonlReader ->
   MinhashDedupSignature -> Buckets -> Cluster -> Filter -> JsonlWriter with FineWeb's settings
   (5-grams, 14 buckets x 8 hashes, sha1 64-bit), LocalPipelineExecutor with 2 workers.
4. Reported per system: wall time end to end (process start to output written), CPU seconds of
   the whole process tree (load-independent), docs/s, peak RSS of the process tree, precision of
   the removed documents (a correct removal is one member of a planted pair whose partner is
   kept; anything else removed is a false positive) and
   recall per Jaccard bin (a pair counts when one of the two is removed), next to the S-curve
   1-(1-J^r)^b of the system's bands. For kaiyuan also the signature stage alone (pure function, one core, MB/s) and
   the scaling run at `--scale` x the documents (time ratio, driver memory at both sizes).

The machine is shared: the load average before and after each run is recorded; compare the
systems by the ratio measured in the same run, and by CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGETS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)
N_GRAMS, BANDS, ROWS = 5, 14, 8          # datatrove's (FineWeb's) buckets x hashes
DATATROVE_PY = REPO / ".venv-datatrove" / "bin" / "python"


# ---- corpus --------------------------------------------------------------------------------

def make_vocab(rng: random.Random, n: int = 30_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    seen, out = set(), []
    while len(out) < n:
        w = "".join(rng.choice(letters) for _ in range(rng.randint(3, 9)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def shingles(words: list[str]) -> set[str]:
    return {" ".join(words[i:i + N_GRAMS]) for i in range(len(words) - N_GRAMS + 1)}


def variant(rng: random.Random, words: list[str], target: float, vocab: list[str]) -> list[str]:
    """Replace k words spaced >= n apart so the 5-gram Jaccard is close to `target`:
    each replacement removes n shingles from the intersection: J = (S - nk) / (S + nk)."""
    s = len(words) - N_GRAMS + 1
    k = round(s * (1 - target) / (N_GRAMS * (1 + target)))
    out = list(words)
    if k <= 0:
        return out
    positions = sorted(rng.sample(range(0, len(words), N_GRAMS), min(k, len(words) // N_GRAMS)))
    for p in positions:
        out[p] = rng.choice(vocab) + "x"          # a word not in the vocabulary: a new shingle for sure
    return out


def build_corpus(out: Path, n_docs: int, dup_fraction: float, seed: int) -> dict:
    """jsonl files of documents; returns the ground truth of the planted pairs."""
    truth_file = out / "truth.json"
    if truth_file.is_file():
        return json.loads(truth_file.read_text())
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    vocab = make_vocab(rng)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.8
    # the inverse-CDF draw that nrng.choice(len(vocab), p=weights) makes (same random stream,
    # same words), with the CDF built once instead of once per document
    cdf = np.cumsum(weights / weights.sum())
    cdf /= cdf[-1]
    n_pairs = int(n_docs * dup_fraction / 2)
    n_base = n_docs - n_pairs
    out.mkdir(parents=True, exist_ok=True)
    pairs = []
    files = []
    per_file = 50_000
    fh = None
    written = 0
    bases_for_pairs = set(rng.sample(range(n_base), n_pairs))
    pair_targets = {}
    for i in sorted(bases_for_pairs):
        pair_targets[i] = TARGETS[len(pair_targets) % len(TARGETS)]
    for i in range(n_base):
        words = [vocab[j] for j in cdf.searchsorted(nrng.random(300), side="right")]
        docs = [(f"d{i:07d}", words)]
        if i in pair_targets:
            v = variant(rng, words, pair_targets[i], vocab)
            vid = f"d{i:07d}v"
            docs.append((vid, v))
            j = len(shingles(words) & shingles(v)) / len(shingles(words) | shingles(v))
            pairs.append({"a": f"d{i:07d}", "b": vid, "target": pair_targets[i], "jaccard": round(j, 4)})
        for doc_id, w in docs:
            if fh is None or written % per_file == 0:
                if fh:
                    fh.close()
                files.append(out / f"part-{len(files):03d}.jsonl")
                fh = open(files[-1], "w")
            sentences = [" ".join(w[k:k + 15]) for k in range(0, len(w), 15)]
            fh.write(json.dumps({"id": doc_id, "text": ". ".join(s.capitalize() for s in sentences) + "."}) + "\n")
            written += 1
    fh.close()
    truth = {"n_docs": written, "pairs": pairs, "files": [str(f) for f in files]}
    truth_file.write_text(json.dumps(truth))
    return truth


# ---- process measurement -------------------------------------------------------------------

def _tree(pid: int) -> list[int]:
    """The process and all its descendants (children of every thread: the JVM starts the Python
    driver and daemon from other threads than its main one)."""
    out = [pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            kids = open(f"/proc/{pid}/task/{t}/children").read().split()
        except OSError:
            continue
        for c in kids:
            out.extend(_tree(int(c)))
    return out


def _rss_kb(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmd(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu_s(pid: int) -> float:
    try:
        st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")      # utime + stime of the process itself
    except (OSError, IndexError):
        return -1.0


def _role(pid: int, root: int) -> str:
    cmd = _cmd(pid)
    exe = cmd.split(" ")[0]
    if "java" in exe:
        return "executor_jvm" if "CoarseGrainedExecutorBackend" in cmd else "jvm"
    if "python" in exe:
        if pid == root or "kaiyuan/jobs" in cmd:
            return "driver_py"
        return "workers_py"
    return "other"


def measure(cmd: list[str], env: dict, cwd: Path, log: Path) -> dict:
    """Run a command; wall time, CPU seconds of every process in its tree (polled from /proc, so
    Python workers that the JVM never waits for are counted), peak RSS of the tree and its parts."""
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT)
    peak = {"tree": 0, "jvm": 0, "executor_jvm": 0, "driver_py": 0, "workers_py": 0}
    cpu: dict[int, float] = {}
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            pids = _tree(proc.pid)
            by_role = {"jvm": 0, "executor_jvm": 0, "driver_py": 0, "workers_py": 0, "other": 0}
            total = 0
            for p in pids:
                rss = _rss_kb(p)
                total += rss
                by_role[_role(p, proc.pid)] += rss
                c = _cpu_s(p)
                if c >= 0:
                    cpu[p] = max(cpu.get(p, 0.0), c)
            peak["tree"] = max(peak["tree"], total)
            for k in ("jvm", "executor_jvm", "driver_py", "workers_py"):
                peak[k] = max(peak[k], by_role[k])
            stop.wait(0.2)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    if rc != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({rc}); see {log}")
    return {"wall_s": round(wall, 1), "cpu_s": round(sum(cpu.values()), 1),
            "peak_rss_mb": {k: round(v / 1024) for k, v in peak.items()},
            "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in os.getloadavg()]}


def spark_env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["HF_HUB_OFFLINE"] = "1"
    return env


# ---- the two systems -----------------------------------------------------------------------

def kaiyuan_config(work: Path, name: str, files: list[str]) -> Path:
    import yaml

    cfg = {"output": str(work / name), "sources": [{"name": "bench", "paths": files, "id_field": "id"}],
           "ingest": {"fingerprint": "size-mtime"},
           "dedup": {"exact": False, "near": True}}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def spark_submit(job: str, config: Path, driver_memory: str, master: str = "local[2]") -> list[str]:
    return ["spark-submit", "--master", master, "--driver-memory", driver_memory,
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=8",
            str(REPO / "kaiyuan" / "jobs" / f"{job}.py"), "--config", str(config)]


DATATROVE_SCRIPT = r'''
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig

if __name__ == "__main__":
    in_dir, work, tasks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, hash_config=HashConfig(hash_fc="sha1", precision=64))   # FineWeb
    s1 = LocalPipelineExecutor(pipeline=[JsonlReader(in_dir, glob_pattern="part-*.jsonl", text_key="text", id_key="id"),
                                         MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg)],
                               tasks=tasks, workers=2, logging_dir=f"{work}/logs/sigs")
    s2 = LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)],
                               tasks=cfg.num_buckets, workers=2, logging_dir=f"{work}/logs/buckets", depends=s1)
    s3 = LocalPipelineExecutor(pipeline=[MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=cfg)],
                               tasks=1, logging_dir=f"{work}/logs/clusters", depends=s2)
    s4 = LocalPipelineExecutor(pipeline=[JsonlReader(in_dir, glob_pattern="part-*.jsonl", text_key="text", id_key="id"),
                                         MinhashDedupFilter(input_folder=f"{work}/remove_ids",
                                                            exclusion_writer=JsonlWriter(f"{work}/removed")),
                                         JsonlWriter(f"{work}/output")],
                               tasks=tasks, workers=2, logging_dir=f"{work}/logs/filter", depends=s3)
    s4.run()
'''


def datatrove_removed(work: Path) -> set[str]:
    import gzip

    out = set()
    for p in sorted((work / "removed").rglob("*.jsonl*")):
        with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as fh:
            out.update(json.loads(line)["id"] for line in fh)
    return out


def kaiyuan_removed(component_dir: Path) -> set[str]:
    import pyarrow.parquet as pq

    d = component_dir / "_removed"
    return set(pq.read_table(d, columns=["id"]).column("id").to_pylist()) if d.is_dir() else set()


# ---- quality against ground truth ----------------------------------------------------------

def quality(removed: set[str], truth: dict, bands: int = BANDS, rows: int = ROWS) -> dict:
    # every planted pair is a true near-duplicate (target J >= 0.5; measured J >= 0.49), and
    # unrelated random documents share no 5-grams (J ~ 0). A correct removal is one member of a
    # planted pair whose partner survives; anything else removed (an unpaired document, or both
    # members of a pair) is a false positive.
    true_removed = sum((p["a"] in removed) != (p["b"] in removed) for p in truth["pairs"])
    precision = true_removed / len(removed) if removed else 1.0
    bins = {}
    for t in TARGETS:
        ps = [p for p in truth["pairs"] if p["target"] == t]
        hit = sum((p["a"] in removed) != (p["b"] in removed) for p in ps)
        mean_j = float(np.mean([p["jaccard"] for p in ps])) if ps else 0.0
        bins[str(t)] = {"pairs": len(ps), "detected": hit, "recall": round(hit / max(1, len(ps)), 4),
                        "mean_jaccard": round(mean_j, 4),
                        "s_curve": round(1 - (1 - mean_j ** rows) ** bands, 4)}
    hi = [p for p in truth["pairs"] if p["jaccard"] >= 0.85]
    recall_hi = sum((p["a"] in removed) != (p["b"] in removed) for p in hi) / max(1, len(hi))
    both = sum((p["a"] in removed) and (p["b"] in removed) for p in truth["pairs"])
    detected = [p["jaccard"] for p in truth["pairs"] if (p["a"] in removed) != (p["b"] in removed)]
    return {"removed": len(removed), "precision": round(precision, 4), "false_positives": len(removed) - true_removed,
            "recall_j_ge_0.85": round(recall_hi, 4), "min_detected_jaccard": min(detected) if detected else None,
            "pairs_with_both_removed": both, "recall_by_target": bins}


def signature_speed(truth: dict, n_docs: int = 20_000) -> dict:
    """The signature stage alone on one core: shingles + MinHash + band keys over Arrow batches."""
    import pyarrow as pa

    from kaiyuan import minhash as mh

    texts = []
    with open(truth["files"][0]) as fh:
        for line in fh:
            texts.append(json.loads(line)["text"])
            if len(texts) >= n_docs:
                break
    from kaiyuan.config import DedupConfig

    bands, rows, num_perm = DedupConfig().lsh()
    a, b = mh.permutations(num_perm, 1)
    n_bytes = sum(len(t.encode()) for t in texts)
    t0 = time.process_time()
    for i in range(0, len(texts), 4096):
        sh = mh.document_shingles(pa.array(texts[i:i + 4096]), N_GRAMS)
        mh.band_keys(mh.signatures(sh, a, b), bands, rows)
    cpu = time.process_time() - t0
    return {"docs": len(texts), "mb": round(n_bytes / 1e6, 1), "cpu_s": round(cpu, 2),
            "mb_per_s_per_core": round(n_bytes / 1e6 / cpu, 1), "docs_per_s_per_core": round(len(texts) / cpu)}


# ---- main ----------------------------------------------------------------------------------

def run_kaiyuan(work: Path, name: str, truth: dict, driver_memory: str) -> dict:
    cfg = kaiyuan_config(work, name, truth["files"])
    env = spark_env()
    ingest_dir = work / name / "ingest" / "bench"
    import shutil

    shutil.rmtree(work / name, ignore_errors=True)
    ing = measure(spark_submit("ingest", cfg, driver_memory), env, work, work / f"{name}-ingest.log")
    res = measure(spark_submit("dedup", cfg, driver_memory), env, work, work / f"{name}-dedup.log")
    from purokit.component import Component

    comp = Component.open(work / name / "dedup" / "bench")
    res["ingest"] = ing
    res["job_timings_s"] = comp.manifest.timings_s
    res["counts"] = comp.manifest.counts
    res["end_to_end_s"] = round(ing["wall_s"] + res["wall_s"], 1)
    res["end_to_end_cpu_s"] = round(ing["cpu_s"] + res["cpu_s"], 1)
    res["docs_per_s"] = round(truth["n_docs"] / res["end_to_end_s"])
    res["docs_per_cpu_s"] = round(truth["n_docs"] / max(res["end_to_end_cpu_s"], 1e-9))
    resolved = comp.manifest.config["resolved"]
    res["quality"] = quality(kaiyuan_removed(comp.directory), truth, resolved["bands"], resolved["rows"])
    text_mb = sum(f.n_bytes for f in Component.open(ingest_dir).manifest.files) / 1e6
    res["input_parquet_mb"] = round(text_mb, 1)
    return res


def driver_memory_run(work: Path, name: str, truth: dict) -> dict:
    """Dedup on a multi-process master so the driver JVM is separate from the executors: its
    peak RSS is what the driver needs, whatever the executors hold."""
    import shutil

    cfg = kaiyuan_config(work, name, truth["files"])
    shutil.rmtree(work / name / "dedup", ignore_errors=True)
    res = measure(spark_submit("dedup", cfg, "1g", master="local-cluster[2,1,2048]"), spark_env(), work,
                  work / f"{name}-dedup-cluster.log")
    shutil.rmtree(work / name / "dedup", ignore_errors=True)
    return res


def driver_memory_check(work: Path, args: argparse.Namespace) -> dict:
    """`driver_memory_run` at `--docs` and `--scale` x `--docs` (corpora and ingests reused)."""
    sizes = [args.docs] + ([args.docs * args.scale] if args.scale > 1 else [])
    out = {}
    for k, n in enumerate(sizes):
        truth = build_corpus(work / f"corpus-{n}", n, args.dup_fraction, args.seed + k)
        out[str(n)] = driver_memory_run(work, f"k{n}", truth)
        print(n, out[str(n)], flush=True)
    return out


def run_datatrove(work: Path, name: str, truth: dict) -> dict:
    import shutil

    in_dir = Path(truth["files"][0]).parent
    dt = work / f"{name}-datatrove"
    shutil.rmtree(dt, ignore_errors=True)
    dt.mkdir(parents=True)
    script = work / "datatrove_minhash.py"
    script.write_text(DATATROVE_SCRIPT)
    n_files = len(truth["files"])
    python = str(DATATROVE_PY) if DATATROVE_PY.exists() else sys.executable
    res = measure([python, str(script), str(in_dir), str(dt), str(max(2, n_files))], spark_env(), work,
                  work / f"{name}-datatrove.log")
    res["docs_per_s"] = round(truth["n_docs"] / res["wall_s"])
    res["docs_per_cpu_s"] = round(truth["n_docs"] / max(res["cpu_s"], 1e-9))
    res["quality"] = quality(datatrove_removed(dt), truth)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--scale", type=int, default=4, help="also run kaiyuan on this many times the documents (0: skip)")
    ap.add_argument("--dup-fraction", type=float, default=0.1)
    ap.add_argument("--work", type=Path, default=REPO / "benchmarks" / "_work" / "dedup")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--skip-datatrove", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--driver-memory-check", action="store_true",
                    help="also run the dedup of both sizes on local-cluster[2,1,2048] with a 1g driver and report the driver JVM's peak RSS")
    ap.add_argument("--only-driver-memory-check", action="store_true", help="just that (corpora and ingests reused)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": " ".join([Path(sys.executable).name] + sys.argv), "cores": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": os.getloadavg(),
                     "params": {"n_grams": N_GRAMS, "bands": BANDS, "rows": ROWS, "hash_bits": 64}}

    def save():             # after every phase, so a later failure keeps what was measured
        results["load_now"] = os.getloadavg()
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")

    if args.only_driver_memory_check:
        results["driver_memory_check"] = driver_memory_check(work, args)
        save()
        print(json.dumps(results, indent=2))
        return 0
    print(f"corpus: {args.docs} docs", flush=True)
    truth = build_corpus(work / f"corpus-{args.docs}", args.docs, args.dup_fraction, args.seed)
    results["corpus"] = {"docs": truth["n_docs"], "pairs": len(truth["pairs"]),
                         "mb": round(sum(os.path.getsize(f) for f in truth["files"]) / 1e6, 1)}
    results["signature_stage"] = signature_speed(truth)
    print("signature stage:", results["signature_stage"], flush=True)
    print("kaiyuan ...", flush=True)
    results["kaiyuan"] = run_kaiyuan(work, f"k{args.docs}", truth, args.driver_memory)
    print("kaiyuan:", {k: results["kaiyuan"][k] for k in ("wall_s", "cpu_s", "docs_per_s")}, flush=True)
    save()
    if not args.skip_datatrove:
        print("datatrove ...", flush=True)
        results["datatrove"] = run_datatrove(work, f"k{args.docs}", truth)
        print("datatrove:", {k: results["datatrove"][k] for k in ("wall_s", "cpu_s", "docs_per_s")}, flush=True)
        results["ratio_wall"] = round(results["datatrove"]["wall_s"] / results["kaiyuan"]["end_to_end_s"], 2)
        results["ratio_cpu"] = round(results["datatrove"]["cpu_s"] / results["kaiyuan"]["end_to_end_cpu_s"], 2)
        save()
    if args.scale > 1:
        n = args.docs * args.scale
        print(f"scaling: {n} docs", flush=True)
        big = build_corpus(work / f"corpus-{n}", n, args.dup_fraction, args.seed + 1)
        results["kaiyuan_scaled"] = run_kaiyuan(work, f"k{n}", big, args.driver_memory)
        results["kaiyuan_scaled"]["docs"] = big["n_docs"]
        results["scaling"] = {
            "docs_ratio": round(big["n_docs"] / truth["n_docs"], 2),
            "wall_ratio": round(results["kaiyuan_scaled"]["wall_s"] / results["kaiyuan"]["wall_s"], 2),
            "cpu_ratio": round(results["kaiyuan_scaled"]["cpu_s"] / results["kaiyuan"]["cpu_s"], 2),
            "driver_py_mb": [results["kaiyuan"]["peak_rss_mb"]["driver_py"], results["kaiyuan_scaled"]["peak_rss_mb"]["driver_py"]],
            "jvm_mb": [results["kaiyuan"]["peak_rss_mb"]["jvm"], results["kaiyuan_scaled"]["peak_rss_mb"]["jvm"]],
        }
        save()
    if args.driver_memory_check:
        results["driver_memory_check"] = driver_memory_check(work, args)
    save()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
