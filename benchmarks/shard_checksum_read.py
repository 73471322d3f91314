"""Read throughput of the shard reader with and without its per-block checks (issue 21).

    .venv/bin/python benchmarks/shard_checksum_read.py [--mtokens 64] [--seq-len 4096] [--batch 16] [--repeats 3]

The product path is `mixtures.ShardReader` (what the trainer reads through): windows of
`seq_len + 1` tokens, `batch` per step, until the set is exhausted. Three readers of the same set,
alternating `--repeats` times (best of each; page cache warm after the first pass):

  checked    the default: every 1 MiB block's xxh3-64 and its token ids verified on first touch
  unchecked  the same reader with `ShardSet.check_blocks` replaced by a no-op (the reader before
             issue 21: no check at all)
  sha256     the peer way to the same guarantee: `verify_hashes=True` (sha256 of every file on
             open) and then the unchecked read

The tokens are real text: every file under /usr/share/doc (and the licences in
/usr/share/common-licenses) as UTF-8 bytes, one document per file, byte ids 1..256, EOS 0,
repeated until `--mtokens` million tokens. Overhead = checked / unchecked time - 1 (target <= 3%),
in wall-clock and in CPU seconds of the process (what other jobs on a shared machine change least);
`time_in_checks_pct` / `cpu_in_checks_pct` are the shares of the checked run's wall / CPU time
spent inside `check_blocks` (timer calls included), measured within one run, so they hold on a
loaded machine where separate runs' times are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mixtures import ShardReader, write_token_lists  # noqa: E402
from mixtures.shards import ShardSet  # noqa: E402


def real_documents(n_tokens: int) -> list[np.ndarray]:
    docs, total = [], 0
    roots = [Path("/usr/share/doc"), Path("/usr/share/common-licenses")]
    files = sorted(p for r in roots if r.is_dir() for p in r.rglob("*") if p.is_file() and not p.is_symlink())
    texts = []
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if p.suffix == ".gz" or not data or b"\0" in data[:1024]:
            continue
        texts.append(np.frombuffer(data, dtype=np.uint8).astype(np.uint16) + 1)
    if not texts:
        raise SystemExit("no text under /usr/share/doc")
    while total < n_tokens:
        for t in texts:
            docs.append(t)
            total += t.size + 1
            if total >= n_tokens:
                break
    return docs


def read_all(path: Path, seq_len: int, batch: int, verify_hashes: bool = False) -> tuple[float, float, int]:
    """(wall s, CPU s of this process, tokens read)."""
    t0, c0 = time.perf_counter(), time.process_time()
    reader = ShardReader(path, global_batch_size=batch, seq_len=seq_len, verify_hashes=verify_hashes)
    n = 0
    for b in reader:
        n += b["input_ids"].size
    return time.perf_counter() - t0, time.process_time() - c0, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtokens", type=float, default=64)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shard-bench-") as tmp:
        path = Path(tmp) / "set"
        docs = real_documents(int(args.mtokens * 1e6))
        m = write_token_lists(path, docs, seq_len=args.seq_len, vocab_size=257, eos_id=0,
                              docs_per_shard=max(1, len(docs) // 8))
        original = ShardSet.check_blocks
        in_checks = [0.0, 0.0]              # wall s, CPU s inside check_blocks

        def timed(self, i, lo, hi):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return original(self, i, lo, hi)
            finally:
                in_checks[0] += time.perf_counter() - t0
                in_checks[1] += time.process_time() - c0

        best = {"checked": float("inf"), "unchecked": float("inf"), "sha256": float("inf")}
        cpu = dict(best)
        check_share = cpu_check_share = float("inf")
        n_read = 0
        read_all(path, args.seq_len, args.batch)              # warm the page cache
        for _ in range(args.repeats):
            for mode in best:
                ShardSet.check_blocks = timed if mode == "checked" else (lambda self, i, lo, hi: None)
                in_checks[:] = [0.0, 0.0]
                t, c, n_read = read_all(path, args.seq_len, args.batch, verify_hashes=mode == "sha256")
                best[mode] = min(best[mode], t)
                cpu[mode] = min(cpu[mode], c)
                print(f"{mode}: {t:.3f} s wall, {c:.3f} s CPU", file=sys.stderr, flush=True)
                if mode == "checked":
                    check_share = min(check_share, in_checks[0] / t)
                    cpu_check_share = min(cpu_check_share, in_checks[1] / c)
        ShardSet.check_blocks = original
    out = {
        "tokens_in_set": m.n_tokens, "shards": len(m.shards), "tokens_read": n_read, "seq_len": args.seq_len,
        "batch": args.batch, "repeats": args.repeats, "loadavg": os.getloadavg()[0],
        **{f"{k}_s": round(v, 3) for k, v in best.items()},
        **{f"{k}_cpu_s": round(v, 3) for k, v in cpu.items()},
        **{f"{k}_mtokens_per_s": round(n_read / v / 1e6, 1) for k, v in best.items()},
        "checked_overhead_pct": round(100 * (best["checked"] / best["unchecked"] - 1), 2),
        "checked_cpu_overhead_pct": round(100 * (cpu["checked"] / cpu["unchecked"] - 1), 2),
        "sha256_cpu_overhead_pct": round(100 * (cpu["sha256"] / cpu["unchecked"] - 1), 2),
        "time_in_checks_pct": round(100 * check_share, 2),      # robust to machine load: same run
        "cpu_in_checks_pct": round(100 * cpu_check_share, 2),
        "sha256_overhead_pct": round(100 * (best["sha256"] / best["unchecked"] - 1), 2),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
