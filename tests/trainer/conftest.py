"""Fixtures for trainer tests: small shard sets (train, held-out, SFT) written through the mixtures
package's writer from a learnable synthetic language, a tiny trained tokenizer, and run configs."""

from __future__ import annotations

import codecs
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from trainer.data import EOS_SYNTHETIC, SyntheticStream

VOCAB = 256
SEQ_LEN = 32
# the Zen of Python as a small English corpus, read from the `this` module's source: importing it
# would print it into the test output
_THIS = Path(importlib.util.find_spec("this").origin).read_text()
ZEN = codecs.decode(re.search(r's = """(.*?)"""', _THIS, re.S).group(1), "rot13")


def synthetic_docs(first: int, n_sequences: int, seq_len: int = 63) -> list[list[int]]:
    """Documents of the synthetic Markov language (EOS removed; the shard writer adds it back)."""
    stream = SyntheticStream(VOCAB, seq_len, seed=0, global_batch=1, micro_batch=1)
    docs: list[list[int]] = []
    for seq in stream.sequences(first, n_sequences):
        cur: list[int] = []
        for t in seq.tolist():
            if t == EOS_SYNTHETIC:
                if cur:
                    docs.append(cur)
                cur = []
            else:
                cur.append(t)
        if cur:
            docs.append(cur)
    return docs


@pytest.fixture(scope="session")
def shard_sets(tmp_path_factory):
    """{"train", "heldout", "sft", "uniform", "curriculum"} shard-set directories (vocab 256, EOS 0)."""
    from mixtures import write_token_lists

    root = tmp_path_factory.mktemp("shards")
    train_docs = synthetic_docs(0, 400)
    write_token_lists(root / "train", train_docs, seq_len=SEQ_LEN, vocab_size=VOCAB, eos_id=EOS_SYNTHETIC,
                      docs_per_shard=150)
    write_token_lists(root / "heldout", synthetic_docs(10**6, 40), seq_len=SEQ_LEN, vocab_size=VOCAB,
                      eos_id=EOS_SYNTHETIC)
    # two phase-2 orders of the same pool: "curriculum" (as drawn) and "uniform" (a seeded shuffle)
    pool = synthetic_docs(2 * 10**6, 200)
    write_token_lists(root / "curriculum", pool, seq_len=SEQ_LEN, vocab_size=VOCAB, eos_id=EOS_SYNTHETIC)
    order = np.random.default_rng(7).permutation(len(pool))
    write_token_lists(root / "uniform", [pool[i] for i in order], seq_len=SEQ_LEN, vocab_size=VOCAB,
                      eos_id=EOS_SYNTHETIC)
    # SFT: "prompt" tokens not trained on, "answer" tokens trained on
    rng = np.random.default_rng(3)
    sft_docs, sft_masks = [], []
    for d in synthetic_docs(3 * 10**6, 120):
        cut = int(rng.integers(1, max(2, len(d))))
        sft_docs.append(d)
        sft_masks.append([0] * cut + [1] * (len(d) - cut))
    write_token_lists(root / "sft", sft_docs, seq_len=SEQ_LEN, vocab_size=VOCAB, eos_id=EOS_SYNTHETIC,
                      loss_masks=sft_masks)
    return {k: str(root / k) for k in ("train", "heldout", "sft", "uniform", "curriculum")}


def run_config(run_dir, shard_sets, **over) -> dict:
    """A tiny run on the train/held-out shard sets, as a config dict."""
    cfg = {
        "run_dir": str(run_dir),
        "seed": 0,
        "model": {"preset": "tiny", "overrides": {"d_model": 32, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32,
                                                  "d_ff": 64}},
        "data": {"train": shard_sets["train"], "eval": shard_sets["heldout"]},
        "train": {"steps": 8, "global_batch": 4, "micro_batch": 2},
        "schedule": {"kind": "wsd", "lr": 2e-3, "warmup_steps": 2, "decay_ratio": 0.5},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "eval": {"every_steps": 4, "sequences": 8},
        "log": {"progress": "none"},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


@pytest.fixture(scope="session")
def bpe(tmp_path_factory):
    """A tiny byte-level BPE trained by mixtures, and a shard set tokenized with it."""
    from mixtures import write_token_lists
    from mixtures.tokenizers import train_bpe

    root = tmp_path_factory.mktemp("bpe")
    texts = [line for line in ZEN.splitlines() if line] * 3
    tok = train_bpe(texts, 320, root / "tokenizer")
    docs = tok.encode_batch([f"{t} ({i})" for i, t in enumerate(texts * 4)])
    write_token_lists(root / "train", docs, seq_len=32, tokenizer=tok.identity)
    write_token_lists(root / "heldout", docs[:20], seq_len=32, tokenizer=tok.identity)
    # a phase-2 pool in two orders: "curriculum" (short documents first) and "uniform" (shuffled)
    pool = docs[20:]
    by_len = sorted(pool, key=len)
    shuffled = [pool[i] for i in np.random.default_rng(5).permutation(len(pool))]
    write_token_lists(root / "phase2-curriculum", by_len, seq_len=32, tokenizer=tok.identity)
    write_token_lists(root / "phase2-uniform", shuffled, seq_len=32, tokenizer=tok.identity)
    return {"tokenizer": root / "tokenizer", "train": str(root / "train"), "heldout": str(root / "heldout"),
            "phase2-curriculum": str(root / "phase2-curriculum"), "phase2-uniform": str(root / "phase2-uniform"),
            "tok": tok}


@pytest.fixture(scope="session")
def trained_run(bpe, tmp_path_factory):
    """A 4-step tiny run on the BPE shard set (its tokenizer recorded as data.tokenizer)."""
    from trainer.config import load_run_config
    from trainer.train import train

    run_dir = tmp_path_factory.mktemp("run")
    cfg = run_config(run_dir, {"train": bpe["train"], "heldout": bpe["heldout"]},
                     **{"data.tokenizer": str(bpe["tokenizer"] / "tokenizer.json"), "train.steps": 4})
    train(load_run_config(None, data=cfg))
    return run_dir
