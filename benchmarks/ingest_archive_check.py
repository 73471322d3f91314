"""What the integrity pass over compressed jsonl costs ingest's reader (issue 21).

    .venv/bin/python benchmarks/ingest_archive_check.py [--copies 3] [--repeats 3]

Real text: every readable file under /usr/share/doc as one JSON line `{"text": ...}`, the whole set
`--copies` times, written as .jsonl.gz (level 6) and .jsonl.zst (with checksum). For each, best of
`--repeats`: `check_archive` alone (the first pass: decompress every member and run its check) and
`read_split` (both passes: the check, then decompress + parse + build the ingest batches), and the
share of the first pass in the reader's time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kaiyuan import readers  # noqa: E402


def corpus() -> bytes:
    lines = []
    for p in sorted(Path("/usr/share/doc").rglob("*")):
        if p.is_file() and not p.is_symlink() and p.suffix != ".gz":
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text.strip():
                lines.append(json.dumps({"text": text}).encode() + b"\n")
    return b"".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    raw = corpus() * args.copies
    out = {"decompressed_mb": round(len(raw) / 1e6, 1), "loadavg": os.getloadavg()[0]}
    opts = readers.ReadOptions()
    with tempfile.TemporaryDirectory(prefix="archive-bench-") as tmp:
        files = {"gzip": Path(tmp) / "a.jsonl.gz", "zstd": Path(tmp) / "a.jsonl.zst"}
        files["gzip"].write_bytes(gzip.compress(raw, 6))
        files["zstd"].write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(raw))
        for comp, path in files.items():
            check = read = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                readers.check_archive(str(path), comp)
                check = min(check, time.perf_counter() - t0)
                t0 = time.perf_counter()
                n = sum(b.num_rows for b in readers.read_split(
                    readers.Split("bench", str(path), path.name, "jsonl", comp), opts))
                read = min(read, time.perf_counter() - t0)
            out[comp] = {"records": n, "check_pass_s": round(check, 3), "read_split_s": round(read, 3),
                         "check_share_pct": round(100 * check / read, 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
