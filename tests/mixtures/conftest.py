"""Fixtures: small real components (Document parquet + manifest via purokit.component) and a small
byte-level BPE trained on their text, so materialization runs end to end in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from purokit.component import finalize_component

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega the of and to in is for on with as by at from that this it").split()


def make_component(root: Path, name: str, n_docs: int, *, seed: int, score: str | None = "edu",
                   min_words: int = 3, max_words: int = 60, files: int = 2, extra: dict | None = None) -> Path:
    """A component of `n_docs` random-word documents with a uniform random score column."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_words, max_words + 1, size=n_docs)
    texts = [f"{name} " + " ".join(rng.choice(WORDS, size=int(n))) for n in lengths]
    cols = {
        "id": [f"{name}-{i:06d}" for i in range(n_docs)],
        "text": texts,
        "source": [name] * n_docs,
        "meta": pa.array([[("i", str(i))] for i in range(n_docs)], type=pa.map_(pa.string(), pa.string())),
    }
    if score:
        cols[f"quality.{score}"] = pa.array(rng.random(n_docs), type=pa.float64())
    for k, v in (extra or {}).items():
        cols[k] = v
    table = pa.table(cols)
    tmp = root / f".tmp-{name}"
    tmp.mkdir(parents=True)
    per = -(-n_docs // files)
    for f in range(files):
        pq.write_table(table.slice(f * per, per), tmp / f"part-{f:05d}.parquet")
    final = root / name
    finalize_component(tmp, final, {"job": "test", "name": name, "config": {"seed": seed}})
    return final


@pytest.fixture(scope="session")
def components(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("components")
    return {
        "web": make_component(root, "web", 1200, seed=1, score="edu"),
        "math": make_component(root, "math", 500, seed=2, score="math"),
        "code": make_component(root, "code", 400, seed=3, score=None),
    }


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory, components) -> Path:
    from purokit.component import Component
    from mixtures.tokenizers import train_bpe

    out = tmp_path_factory.mktemp("tok")
    texts = (t for c in components.values() for t in Component.open(c).read(["text"]).column("text").to_pylist())
    train_bpe(texts, 400, out, name="test-bpe")
    return out / "tokenizer.json"
