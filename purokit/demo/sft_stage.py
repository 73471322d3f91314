"""Demo stage "sft": the synthetic data becomes SFT shards and a short SFT of the CMA model.

1. gather the accepted SFT records of the synth stages (reasoning on/off pairs, and whatever the
   domain generators accepted), split them deterministically into train and held-out by record id;
2. render them with the ChatML template into tokens plus an assistant-only loss mask and pack them
   into SFT shard sets (mixtures.sft), with the same tokenizer the pretraining shards used;
3. fine-tune the CMA average (trainer stage) with the Puro SFT preset (`sft-puro`: cosine schedule,
   MuonH x10) scaled down to the demo, loss on assistant tokens only, documents masked;
4. report the held-out SFT loss before and after.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from purokit import atomic
from purokit.hashing import stable_id

SIZES = {"sft_steps": 30, "sft_global_batch": 8, "sft_seq_len": 512, "sft_eval_fraction": 0.15}


def _size(ctx, key: str):
    return type(SIZES[key])(ctx.size(key, SIZES[key]))


def _record_files(ctx) -> list[tuple[str, Path]]:
    """(generator, train jsonl) of every synth stage that exported SFT records."""
    found: list[tuple[str, Path]] = []
    synth = ctx.results.get("synth", {})
    if synth.get("train_jsonl"):
        found.append(("reasoning_pairs", Path(synth["train_jsonl"])))
    for name, res in ctx.results.get("synth_domains", {}).items():
        if isinstance(res, dict) and res.get("train_jsonl"):
            found.append((name, Path(res["train_jsonl"])))
    return [(g, p) for g, p in found if p.is_file()]


def split_records(files: list[tuple[str, Path]], eval_fraction: float, out: Path) -> dict[str, Any]:
    """Write train.jsonl / eval.jsonl: a record goes to eval when the hash of its id falls below
    `eval_fraction` (pairs stay together: the key is the pair id when there is one)."""
    rows = {"train": [], "eval": []}
    per_generator: dict[str, int] = {}
    for generator, path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("kind", "sft") != "sft" or not rec.get("messages"):
                continue
            key = rec.get("pair_id") or rec.get("id") or line
            bucket = int(stable_id("sft-eval", key), 16) / 16 ** 16
            rows["eval" if bucket < eval_fraction else "train"].append(line)
            per_generator[generator] = per_generator.get(generator, 0) + 1
    if not rows["eval"] and len(rows["train"]) > 1:   # a tiny set still gets a held-out record
        rows["eval"].append(rows["train"].pop())
    for split, lines in rows.items():
        atomic.write_text(out / f"{split}.jsonl", "".join(ln + "\n" for ln in lines))
    return {"train": len(rows["train"]), "eval": len(rows["eval"]), "per_generator": per_generator}


def held_out_loss(checkpoint: str, cfg) -> float:
    """Held-out loss of a checkpoint on `cfg`'s eval set, computed as the trainer computes it."""
    from trainer.checkpoint import load_weights, read_state
    from trainer.model import ModelConfig, Transformer
    from trainer.train import Dist, eval_batches, evaluate

    model = Transformer(ModelConfig.model_validate(read_state(checkpoint).model))
    model.load_state_dict(load_weights(checkpoint), strict=False)
    dist_ = Dist("cpu")
    batches = eval_batches(cfg, dist_.rank, dist_.world, cfg.train.micro_batch)
    return evaluate(model.float(), batches, dist_, "fp32", cfg.data.document_mask)["eval_loss"]


def run(ctx) -> dict[str, Any]:
    from mixtures.sft import SftConfig, materialize_sft
    from mixtures.tokenizers import TokenizerSpec
    from trainer.config import load_run_config
    from trainer.train import train

    out = ctx.stage_dir()
    tokenizer = ctx.result("mixtures")["tokenizer"]
    cma = ctx.result("trainer")["runs"]["CMA"]["average"]
    files = _record_files(ctx)
    if not files:
        raise RuntimeError("no synth stage exported SFT records (see the synth stage's acceptance table)")
    counts = split_records(files, _size(ctx, "sft_eval_fraction"), out / "records")
    ctx.step(f"{counts['train']} train / {counts['eval']} held-out SFT records from "
             + ", ".join(f"{g} ({n})" for g, n in counts["per_generator"].items()))

    seq_len = _size(ctx, "sft_seq_len")
    sets: dict[str, str] = {}
    packed: dict[str, Any] = {}
    for split in ("train", "eval"):
        cfg = SftConfig(name=f"sft-{split}", tokenizer=TokenizerSpec(kind="hf", path=tokenizer), seq_len=seq_len,
                        inputs=[str(out / "records" / f"{split}.jsonl")], seed=0)
        m = materialize_sft(cfg, out / f"shards-{split}", progress=ctx.step)
        sets[split] = str(out / f"shards-{split}")
        packed[split] = {"tokens": m.n_tokens, **m.counts}

    steps, gbs = _size(ctx, "sft_steps"), _size(ctx, "sft_global_batch")
    windows = (packed["train"]["tokens"] - 1) // seq_len
    if windows < gbs:   # few accepted records (a weak teacher): smaller batches, more passes
        ctx.step(f"only {windows} packed windows of SFT data: global batch {gbs} -> {max(1, windows)}")
        gbs = max(1, windows)
    run_cfg = load_run_config(None, data={
        "extends": "sft-puro",
        "run_dir": str(out / "run"),
        "model": {"preset": "tiny"},
        "data": {"train": sets["train"], "eval": sets["eval"], "tokenizer": tokenizer, "loop": True,
                 "document_mask": True, "document_positions": True},
        "train": {"steps": steps, "global_batch": gbs, "micro_batch": gbs},
        # the paper's 1e-5 is for a 2B model after 1T tokens; a 0.1M-parameter toy needs a larger rate
        "schedule": {"kind": "cosine", "lr": 1e-3, "lr_min": 1e-5, "warmup_steps": 0},
        "init_from": {"path": cma, "load_optimizer": False, "continue_data": False, "reset_step": True},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "eval": {"every_steps": max(1, steps // 3), "sequences": 64},
        "log": {"every_steps": max(1, steps // 6), "progress": "none"},
    })
    atomic.write_text(out / "sft.yaml", json.dumps(run_cfg.dump(), indent=2))
    before = held_out_loss(cma, run_cfg)
    ctx.step(f"SFT of the CMA model: {steps} steps x {gbs} x {seq_len} tokens, loss on assistant tokens only; "
             f"held-out SFT loss before {before:.4f}")
    res = train(run_cfg)
    ctx.step(f"held-out SFT loss after {res['eval_loss']:.4f} (before {before:.4f})")
    return {"records": counts, "sets": sets, "packed": packed, "run_dir": res["run_dir"], "metrics": res["metrics"],
            "checkpoint": res["checkpoint"], "config": str(out / "sft.yaml"),
            "eval_loss_before": before, "eval_loss_after": res["eval_loss"]}


def summary(result: dict[str, Any]) -> list[str]:
    return [f"SFT shards: {result['sets']['train']} ({result['records']['train']} conversations)",
            f"SFT run: {result['run_dir']}; held-out SFT loss {result['eval_loss_before']:.4f} -> "
            f"{result['eval_loss_after']:.4f}"]
