"""Demo stage "tokenizer": a small byte-level BPE trained on a seeded sample of the kaiyuan stage's
components (`python -m mixtures train-tokenizer` does the same). A small vocabulary keeps the CPU
models of the later stages fast; everything downstream records this tokenizer's digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.manifest import MANIFEST_NAME


def _is_component(p: Path) -> bool:
    try:
        return json.loads((p / MANIFEST_NAME).read_text()).get("schema") == "component/1"
    except (OSError, json.JSONDecodeError):
        return False


def component_dirs(result: dict[str, Any]) -> dict[str, Path]:
    """Component directories named anywhere in a stage result (paths, or directories of them), by
    component name."""
    from common.component import Component

    found: dict[str, Path] = {}

    def visit(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, str) and v and len(v) < 4096 and Path(v).is_dir():
            p = Path(v)
            if _is_component(p):
                found.setdefault(Component.open(p).name, p)
            else:
                for child in sorted(p.iterdir()):
                    if child.is_dir() and _is_component(child):
                        found.setdefault(Component.open(child).name, child)

    visit(result)
    return found


def run(ctx) -> dict[str, Any]:
    from mixtures.tokenizers import sample_component_texts, train_bpe

    comps = component_dirs(ctx.result("kaiyuan"))
    if not comps:
        raise RuntimeError("the kaiyuan stage's result names no components")
    vocab = int(ctx.size("tokenizer_vocab", 4096))
    docs = int(ctx.size("tokenizer_docs", 4000))
    out = ctx.stage_dir() / "bpe"
    ctx.step(f"training a byte-level BPE (vocab {vocab}) on up to {docs:,} docs from each of {', '.join(sorted(comps))}")
    tok = train_bpe(sample_component_texts([str(comps[n]) for n in sorted(comps)], docs, seed=0), vocab, out,
                    name=f"demo-bpe-{vocab}")
    sample = tok.encode("The derivative of x^2 is 2x; def f(x): return x * x")
    ctx.step(f"tokenizer: {out / 'tokenizer.json'} (vocab {tok.vocab_size}, EOS {tok.eos_id}, digest "
             f"{tok.identity.digest[:12]}); a math/code line is {len(sample)} tokens")
    return {"tokenizer": str(out / "tokenizer.json"), "vocab_size": tok.vocab_size, "eos_id": tok.eos_id,
            "digest": tok.identity.digest, "components": {n: str(p) for n, p in sorted(comps.items())}}


def summary(result: dict[str, Any]) -> list[str]:
    return [f"tokenizer.json: {result['tokenizer']} (vocab {result['vocab_size']}, digest {result['digest'][:12]})"]
