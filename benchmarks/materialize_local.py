"""Materialization throughput and memory (issue 3 "Performance").

    .venv/bin/python benchmarks/materialize_local.py [--docs 6000] [--sizes 1,2,4] [--spark] [--repeats 2]

1. The practical limit: raw `tokenizers` batch encoding (`encode_batch_fast`, batches of 2,048,
   the batch size materialization uses) of exactly the pool's texts, tokens/s.
2. Local materialization end to end (`mixtures.materialize`: read parquet, tokenize, spill, plan,
   write shards, hash, manifest) of the same pool into one uniform shard set, tokens/s, and its
   ratio to (1). Target >= 70%. (1) and (2) alternate `--repeats` times; best of each.
3. Peak RSS of a fresh process materializing pools of 1x, 2x, 4x the size (streaming: it should
   grow with per-document metadata only, never with text or tokens).
4. With --spark: the Spark engine (kaiyuan/spark/materialize.py) in local[2] on the 1x pool, tokens/s
   (benchmarks/materialize_spark.py measures how it scales, on local-cluster).

Both paths use the same TOKENIZERS_PARALLELISM setting (printed). Timings on a shared machine are
noisy: the load average is printed with the results, and only ratios measured side by side in
one run are meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def make_pool(root: Path, n_docs: int, seed: int = 0) -> dict[str, Path]:
    """Three components of Zipf-distributed words (web scored, math scored, code unscored)."""
    from purokit.component import finalize_component

    vrng = np.random.default_rng(12345)          # one vocabulary for every pool size
    vocab = np.array(["".join(vrng.choice(list("etaoinshrdlucmfwypvbgkqjxz"), size=int(vrng.integers(1, 9))))
                      for _ in range(20_000)])
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab.size + 1)
    p = 1.0 / ranks
    p /= p.sum()
    out = {}
    per = 1000                                   # bounded files, as kaiyuan writes them; generated file by file
    for ci, (name, scored) in enumerate((("web", True), ("math", True), ("code", False))):
        n = n_docs if name == "web" else n_docs // 2
        tmp = root / f".tmp-{name}"
        tmp.mkdir(parents=True)
        for f, lo in enumerate(range(0, n, per)):
            k = min(per, n - lo)
            lengths = rng.integers(50, 600, size=k)
            words = rng.choice(vocab, size=int(lengths.sum()), p=p)
            cuts = np.concatenate([[0], np.cumsum(lengths)])
            cols = {"id": [f"{name}-{i:08d}" for i in range(lo, lo + k)],
                    "text": [" ".join(words[cuts[i]:cuts[i + 1]]) + "." for i in range(k)], "source": [name] * k,
                    "meta": pa.array([[] for _ in range(k)], type=pa.map_(pa.string(), pa.string()))}
            if scored:
                cols["quality.score"] = pa.array(rng.random(k), type=pa.float64())
            pq.write_table(pa.table(cols), tmp / f"part-{f:05d}.parquet")
        finalize_component(tmp, root / name, {"job": "benchmark", "name": name})
        out[name] = root / name
    return out


def make_pools(prefix: str, docs: int, sizes: list[int], vocab: int) -> tuple[Path, dict[int, dict[str, Path]], Path]:
    """A work directory, pools of each size (`make_pool`, 1x = `docs` web documents) and a
    byte-level BPE of `vocab` ids trained on the smallest pool: (work, {size: pool}, tokenizer.json)."""
    from purokit.component import Component
    from mixtures.tokenizers import train_bpe

    work = Path(tempfile.mkdtemp(prefix=prefix))
    pools = {s: make_pool(work / f"pool{s}", docs * s, seed=s) for s in sizes}
    sample = (t for c in pools[sizes[0]].values() for t in Component.open(c).read(["text"]).column("text").to_pylist()[:1500])
    train_bpe(sample, vocab, work / "tok")
    return work, pools, work / "tok" / "tokenizer.json"


def spec_for(comps: dict[str, Path], tokenizer_json: Path) -> dict:
    return {"name": "bench", "tokenizer": {"kind": "hf", "path": str(tokenizer_json)}, "seq_len": 1024,
            "bucket_count": 8,
            "components": [{"name": "web", "path": str(comps["web"]), "score_field": "score"},
                           {"name": "math", "path": str(comps["math"]), "score_field": "score"},
                           {"name": "code", "path": str(comps["code"])}],
            "phases": [{"name": "p", "orders": ["uniform"], "components": {"web": {}, "math": {}, "code": {}}}]}


def raw_encode(tokenizer_json: Path, comps: dict[str, Path]) -> tuple[int, float]:
    from purokit.component import Component
    from mixtures.tokenizers import load_tokenizer

    hf = load_tokenizer(str(tokenizer_json)).hf
    texts = [t for c in comps.values() for t in Component.open(c).read(["text"]).column("text").to_pylist()]
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for i in range(0, len(texts), 2048):
        n += sum(len(e.ids) for e in hf.encode_batch_fast(texts[i:i + 2048], add_special_tokens=False))
    return n, time.perf_counter() - t0, time.process_time() - c0


def local_run(spec: dict, out: Path) -> tuple[int, float]:
    from mixtures.materialize import materialize
    from mixtures.spec import parse_spec

    t0, c0 = time.perf_counter(), time.process_time()
    res = materialize(parse_spec(spec), out, progress=lambda m: None, force=True)
    return res["p-uniform"].n_tokens, time.perf_counter() - t0, time.process_time() - c0


def child_main(args) -> None:
    spec = json.loads(Path(args.child).read_text())
    n, dt, _ = local_run(spec, Path(args.child_out))
    print(json.dumps({"n_tokens": n, "seconds": dt,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=6000, help="web documents in the 1x pool (math, code: half)")
    ap.add_argument("--sizes", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--spark", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return
    from purokit.component import Component

    print(f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}, cores {os.cpu_count()}, "
          f"load average at start {os.getloadavg()[0]:.2f}")
    sizes = [int(s) for s in args.sizes.split(",")]
    work, pools, tok_json = make_pools("bench-materialize-", args.docs, sizes, args.vocab)
    base = pools[sizes[0]]
    spec = spec_for(base, tok_json)
    raw_best, local_best, raw_cpu, local_cpu = 0.0, 0.0, 0.0, 0.0
    for r in range(args.repeats):
        n_raw, dt_raw, cpu_raw = raw_encode(tok_json, base)
        n_loc, dt_loc, cpu_loc = local_run(spec, work / "out")
        raw_best, local_best = max(raw_best, n_raw / dt_raw), max(local_best, n_loc / dt_loc)
        raw_cpu, local_cpu = max(raw_cpu, n_raw / cpu_raw), max(local_cpu, n_loc / cpu_loc)
        print(f"repeat {r}: raw encode {n_raw:,} tokens in {dt_raw:.2f}s wall / {cpu_raw:.2f}s CPU; "
              f"materialize {n_loc:,} stream tokens (incl. EOS) in {dt_loc:.2f}s wall / {cpu_loc:.2f}s CPU")
    print(f"RESULT local materialization {local_best:,.0f} tokens/s wall = {100 * local_best / raw_best:.0f}% of raw "
          f"tokenizers batch encoding ({raw_best:,.0f} tokens/s); per CPU second {local_cpu:,.0f} vs {raw_cpu:,.0f} "
          f"tokens = {100 * local_cpu / raw_cpu:.0f}% (independent of the machine's load)")
    for s in sizes:
        spec_path = work / f"spec{s}.json"
        spec_path.write_text(json.dumps(spec_for(pools[s], tok_json)))
        proc = subprocess.run([sys.executable, __file__, "--child", str(spec_path), "--child-out", str(work / f"o{s}")],
                              capture_output=True, text=True, check=True)
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        n_docs = sum(Component.open(c).manifest.n_docs for c in pools[s].values())
        text_mb = sum(sum(f.n_bytes for f in Component.open(c).manifest.files) for c in pools[s].values()) / 2**20
        print(f"RESULT pool {s}x: {n_docs:,} docs, {got['n_tokens']:,} tokens, parquet {text_mb:.0f} MB -> "
              f"peak RSS {got['peak_rss_mb']:.0f} MB, {got['n_tokens'] / got['seconds']:,.0f} tokens/s")
    if args.spark:
        from pyspark.sql import SparkSession

        from kaiyuan.spark.materialize import run
        from mixtures.spec import parse_spec

        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "4").config("spark.driver.memory", "2g")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        t0 = time.perf_counter()
        res = run(spark, parse_spec(spec), work / "spark", progress=lambda m: None, force=True)
        dt = time.perf_counter() - t0
        spark.stop()
        n = res["p-uniform"].n_tokens
        same = res["p-uniform"].set_digest == json.loads((work / "out" / "p-uniform" / "run.json").read_text())["counts"]["set_digest"]
        print(f"RESULT spark local[2] materialization {n / dt:,.0f} tokens/s ({n:,} tokens in {dt:.1f}s); "
              f"same shards as local: {same}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
