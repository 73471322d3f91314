"""Small real components for proxy_eval tests (written through purokit.component)."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from purokit.component import finalize_component
from purokit.document import BASE_SCHEMA


def write_component(root: Path, name: str, texts: list[str], scores: list[float | None] | None = None,
                    n_tokens: list[int] | None = None, score_name: str = "hq", files: int = 2) -> Path:
    """A component of `texts` with `n_tokens` (default: word count) and an optional score column."""
    tmp = root / f".build-{name}"
    tmp.mkdir(parents=True, exist_ok=True)
    n = len(texts)
    toks = n_tokens or [max(1, len(t.split())) for t in texts]
    fields = list(BASE_SCHEMA) + [pa.field("n_tokens", pa.int64())]
    cols = {
        "id": [f"{name}-{i:06d}" for i in range(n)],
        "text": texts,
        "source": [name] * n,
        "meta": [[] for _ in range(n)],
        "n_tokens": toks,
    }
    if scores is not None:
        fields.append(pa.field(f"quality.{score_name}", pa.float64()))
        cols[f"quality.{score_name}"] = scores
    schema = pa.schema(fields)
    per = -(-n // files)
    for f in range(files):
        lo, hi = f * per, min(n, (f + 1) * per)
        if lo >= hi:
            continue
        table = pa.table({k: v[lo:hi] for k, v in cols.items()}, schema=schema)
        pq.write_table(table, tmp / f"part-{f:05d}.parquet")
    final = root / name
    finalize_component(tmp, final, {"job": "test.ingest", "name": name, "n_tokens": sum(toks), "tokenizer": "words"})
    return final


def synthetic_scored_component(root: Path, name: str = "web", n_docs: int = 2000, seed: int = 0,
                               scored: bool = True) -> Path:
    rng = random.Random(seed)
    texts, scores, toks = [], [], []
    for i in range(n_docs):
        k = rng.randint(20, 200)
        texts.append(" ".join(f"w{rng.randint(0, 999)}" for _ in range(k)))
        toks.append(k)
        scores.append(rng.random())
    return write_component(root, name, texts, scores if scored else None, toks)
