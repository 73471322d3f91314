"""Demo stage "tokenizer": a small byte-level BPE trained on a seeded sample of the kaiyuan stage's
components (`python -m mixtures train-tokenizer` does the same). A small vocabulary keeps the CPU
models of the later stages fast; everything downstream records this tokenizer's digest."""

from __future__ import annotations

from typing import Any

from purokit.demo.context import component_dirs


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
