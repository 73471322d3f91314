"""Export throughput against reading the set once (issue 37 "Done when").

    .venv/bin/python benchmarks/export_bench.py [--mtokens 100] [--formats megatron,hf,nanotron] [--repeats 2]
    .venv/bin/python benchmarks/export_bench.py --mtokens 100 --build-only     # build the set, measure nothing

The set: a curriculum shard set of `--mtokens` million stream tokens (16 buckets; web and math
scored, code unscored and repeated twice), materialized with `mixtures.materialize` from
components of Zipf-distributed words and a byte-level BPE (vocab 8,192, uint16 tokens), built once
into `benchmarks/_work/export-<mtokens>m/` (git-ignored) and reused by later runs.

Measured in one run, alternating `--repeats` times (best of each; the page cache is warm after
the first pass, for both):
  read     `ShardReader` (the trainer's reader) over the whole set: windows of seq_len + 1, batches
           of 16, every token once (`python -m mixtures export` reads the same stream through the
           same `ShardSet`);
  copy     reading the shard files and writing their bytes to a new file (`shutil.copyfileobj`,
           fsync): what "writing it once" costs on this disk;
  export   `mixtures.export.export_set` for each format into a fresh directory (fsync, rename).
The target: export seconds <= read seconds + copy seconds (ratio <= 1), per format.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._results import WORK  # noqa: E402

WORDS_PER_FILE = 1000
SET_NAME = "p-curriculum"


def _vocabulary() -> tuple[np.ndarray, np.ndarray]:
    """20,000 made-up words and their Zipf probabilities (one vocabulary for every size)."""
    vrng = np.random.default_rng(12345)
    letters = list("etaoinshrdlucmfwypvbgkqjxz")
    vocab = np.array(["".join(vrng.choice(letters, size=int(vrng.integers(1, 9)))) for _ in range(20_000)])
    p = 1.0 / np.arange(1, vocab.size + 1)
    return vocab, np.cumsum(p / p.sum())


def _texts(rng: np.random.Generator, vocab: np.ndarray, cdf: np.ndarray, n: int) -> list[str]:
    lengths = rng.integers(50, 600, size=n)
    words = vocab[np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), vocab.size - 1)]
    cuts = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(words[cuts[i]:cuts[i + 1]]) + "." for i in range(n)]


def write_component(root: Path, name: str, n_docs: int, scored: bool, seed: int) -> Path:
    """A component of `n_docs` documents, written file by file (flat memory at any size)."""
    from purokit.component import finalize_component

    vocab, cdf = _vocabulary()
    rng = np.random.default_rng(seed)
    tmp = root / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f, lo in enumerate(range(0, n_docs, WORDS_PER_FILE)):
        n = min(WORDS_PER_FILE, n_docs - lo)
        cols = {"id": [f"{name}-{i:08d}" for i in range(lo, lo + n)], "text": _texts(rng, vocab, cdf, n),
                "source": [name] * n, "meta": pa.array([[] for _ in range(n)], type=pa.map_(pa.string(), pa.string()))}
        if scored:
            cols["quality.score"] = pa.array(rng.random(n), type=pa.float64())
        pq.write_table(pa.table(cols), tmp / f"part-{f:05d}.parquet")
    finalize_component(tmp, root / name, {"job": "benchmark", "name": name})
    return root / name


def build_set(mtokens: float, progress=print) -> Path:
    """The curriculum set of ~`mtokens` million tokens under benchmarks/_work (built once)."""
    from mixtures.materialize import materialize
    from mixtures.spec import parse_spec
    from mixtures.tokenizers import train_bpe

    work = WORK / f"export-{mtokens:g}m"
    final = work / "shards" / SET_NAME
    if (final / "manifest.json").is_file():
        return final
    work.mkdir(parents=True, exist_ok=True)
    tok_dir = work / "tok"
    vocab, cdf = _vocabulary()
    sample = _texts(np.random.default_rng(0), vocab, cdf, 1500)
    if not (tok_dir / "tokenizer.json").is_file():
        train_bpe(sample, 8192, tok_dir)
    from mixtures.tokenizers import load_tokenizer

    tok = load_tokenizer(str(tok_dir / "tokenizer.json"))
    per_doc = float(np.mean([len(ids) + 1 for ids in tok.encode_batch(sample)]))
    # web : math : code = 2 : 1 : 1 documents, code read twice -> 5 document-reads per 4 documents
    n_web = int(mtokens * 1e6 / per_doc / 5 * 2)
    comps = {}
    for seed, (name, n, scored) in enumerate((("web", n_web, True), ("math", n_web // 2, True),
                                              ("code", n_web // 2, False))):
        if not (work / "components" / name / "manifest.json").is_file():
            progress(f"writing component {name}: {n:,} documents")
            write_component(work / "components", name, n, scored, seed + 1)
        comps[name] = work / "components" / name
    spec = {"name": "export-bench", "tokenizer": {"kind": "hf", "path": str(tok_dir / "tokenizer.json")},
            "seq_len": 2048, "bucket_count": 16,
            "components": [{"name": "web", "path": str(comps["web"]), "score_field": "score"},
                           {"name": "math", "path": str(comps["math"]), "score_field": "score"},
                           {"name": "code", "path": str(comps["code"]), "repeat": "uniform"}],
            "phases": [{"name": "p", "orders": ["curriculum"],
                        "components": {"web": {}, "math": {}, "code": {"n_tokens": _code_tokens(comps["code"], per_doc)}}}]}
    progress(f"materializing {SET_NAME} (~{mtokens:g}M tokens, {per_doc:.0f} tokens per document)")
    materialize(parse_spec(spec), work / "shards", progress=progress)
    return final


def _code_tokens(code: Path, per_doc: float) -> int:
    """Twice the code component's tokens (estimated): every code document is repeated once."""
    from purokit.component import Component

    return int(2 * Component.open(code).manifest.n_docs * per_doc)


# ---- measurements ------------------------------------------------------------------------------

def read_once(path: Path, batch: int = 16) -> tuple[float, int]:
    """(seconds, tokens) for `ShardReader` over the whole set."""
    from mixtures import ShardReader

    t0 = time.perf_counter()
    n = 0
    for b in ShardReader(path, global_batch_size=batch):
        n += b["input_ids"].size
    return time.perf_counter() - t0, n


def copy_once(path: Path, dest: Path) -> tuple[float, int]:
    """(seconds, bytes) to read every token file of the set and write its bytes to one new file."""
    from mixtures.shards import ShardManifest

    m = ShardManifest.read(path)
    t0 = time.perf_counter()
    with open(dest, "wb") as out:
        for s in m.shards:
            with open(path / s.tokens_path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 23)
    dt = time.perf_counter() - t0
    n = dest.stat().st_size
    dest.unlink()
    return dt, n


def export_once(path: Path, fmt: str, out: Path) -> tuple[float, int]:
    """(seconds, bytes written) of `export_set` into a fresh directory."""
    from mixtures.export import export_set

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    export_set(path, fmt, out, progress=lambda m: None)
    dt = time.perf_counter() - t0
    n = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out)
    return dt, n


def child_rss(path: Path, fmt: str, out: Path) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh process exporting the set, and of the same process doing nothing
    but its imports."""
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a child would report this
    # (large) benchmark process's peak
    code = ("import re, sys; from mixtures.export import export_set; "
            f"export_set({str(path)!r}, {fmt!r}, {str(out)!r}, progress=lambda m: None) if sys.argv[1] == 'run' else None; "
            "print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024)")
    run = float(subprocess.run([sys.executable, "-c", code, "run"], capture_output=True, text=True, check=True,
                               cwd=REPO).stdout.split()[-1])
    base = float(subprocess.run([sys.executable, "-c", code, "imports"], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return run, base


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtokens", type=float, default=100)
    ap.add_argument("--formats", default="megatron,hf,nanotron")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--small-mtokens", type=float, default=2, help="a second, small set: peak RSS at both sizes")
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results" / "export.json"))
    args = ap.parse_args()
    path = build_set(args.mtokens)
    small = build_set(args.small_mtokens)
    if args.build_only:
        return
    from mixtures.shards import ShardManifest

    m = ShardManifest.read(path)
    load_start = os.getloadavg()[0]
    print(f"set {path}: {m.n_tokens:,} tokens, {m.n_docs:,} documents, {len(m.shards)} shards, {m.dtype}; "
          f"cores {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}")
    scratch = Path(tempfile.mkdtemp(prefix="export-bench-", dir=WORK))
    formats = [f for f in args.formats.split(",") if f]
    best: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for r in range(args.repeats):
        t_read, n_read = read_once(path)
        t_copy, n_copy = copy_once(path, scratch / "copy.bin")
        best["read"] = min(best.get("read", 1e30), t_read)
        best["copy"] = min(best.get("copy", 1e30), t_copy)
        sizes["read_tokens"], sizes["copy"] = n_read, n_copy
        line = [f"read {t_read:.2f}s ({n_read / t_read:,.0f} tokens/s)", f"copy {t_copy:.2f}s ({n_copy / t_copy / 2**20:,.0f} MiB/s)"]
        for fmt in formats:
            t, n = export_once(path, fmt, scratch / fmt)
            best[fmt] = min(best.get(fmt, 1e30), t)
            sizes[fmt] = n
            line.append(f"{fmt} {t:.2f}s")
        print(f"repeat {r}: " + ", ".join(line))
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv, "set": str(path),
              "machine": f"{os.cpu_count()} cores, load average at start {load_start:.2f}",
              "n_tokens": m.n_tokens, "n_docs": m.n_docs, "set_bytes": sizes["copy"],
              "read_s": best["read"], "read_tokens_per_s": sizes["read_tokens"] / best["read"],
              "copy_s": best["copy"], "copy_bytes_per_s": sizes["copy"] / best["copy"], "formats": {},
              "load_average_end": os.getloadavg()[0]}
    for fmt in formats:
        # the anchor: reading the set once plus writing this export's bytes once (at the copy's rate)
        anchor = best["read"] + sizes[fmt] / result["copy_bytes_per_s"]
        rss, base = child_rss(path, fmt, scratch / f"rss-{fmt}")
        rss_small, _ = child_rss(small, fmt, scratch / f"rss-small-{fmt}")
        result["formats"][fmt] = {"export_s": best[fmt], "export_tokens_per_s": m.n_tokens / best[fmt],
                                  "bytes_written": sizes[fmt], "anchor_s": anchor, "ratio_to_anchor": best[fmt] / anchor,
                                  "peak_rss_mib": rss, "peak_rss_small_set_mib": rss_small, "imports_rss_mib": base}
        print(f"RESULT {fmt}: export {m.n_tokens / best[fmt]:,.0f} tokens/s ({best[fmt]:.2f}s, {sizes[fmt] / 2**20:,.0f} MiB) "
              f"vs read once + write once {anchor:.2f}s (read {result['read_tokens_per_s']:,.0f} tokens/s): "
              f"ratio {best[fmt] / anchor:.2f}; peak RSS {rss:.0f} MiB ({args.small_mtokens:g}M-token set: "
              f"{rss_small:.0f} MiB; imports alone {base:.0f} MiB)")
    shutil.rmtree(scratch, ignore_errors=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}; load average at end {result['load_average_end']:.2f}")


if __name__ == "__main__":
    main()
