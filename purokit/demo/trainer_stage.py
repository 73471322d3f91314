"""Demo stage "trainer": Puro's two-phase training and its Phase-2 variants on the mixtures stage's
shard sets (Puro §2.1, §3.3, §3.4), with the `tiny` preset on CPU.

1. phase 1 on the broad uniform stream, MuonH (10x the base rate) + AdamW, the open-ended power
   schedule of Shen et al., shaped like Puro's (the rate falls ~4.8x over the phase);
2. phase 2 three ways from the SAME phase-1 checkpoint (weights and optimizer state; data restarts
   at the phase-2 sets), configs built by `trainer.variants`:
   UD  (uniform stream, linear decay from the phase-1 terminal rate),
   CD  (curriculum stream, the same decay),
   CMA (curriculum, the decay up to resume_step, then constant at schedule(resume_step), and the
        average of the last 6 checkpoints); its final checkpoint is the CDC endpoint;
3. held-out loss of each on the mixtures stage's eval set;
4. export of the CMA average to a Hugging Face Qwen3ForCausalLM directory, loaded back with
   transformers (logits checked against the trainer's, a greedy continuation printed).

Every run's config is written as YAML next to it, so `python -m trainer train --config <it>` reruns
(or resumes) it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from purokit import atomic

SIZES = {  # profile key -> default (the "demo" profile's values are in purokit/demo/context.py)
    "trainer_phase1_steps": 400, "trainer_phase2_steps": 200, "trainer_continue_steps": 100,
    "trainer_avg_spacing": 20, "trainer_global_batch": 8, "trainer_eval_sequences": 48, "trainer_eval_every": 80,
}


def _size(ctx, key: str) -> int:
    return int(ctx.size(key, SIZES[key]))


def _write(cfg, path: Path) -> Path:
    atomic.write_text(path, yaml.safe_dump(cfg.dump() if hasattr(cfg, "dump") else cfg, sort_keys=False))
    return path


def available_steps(shard_set: str, global_batch: int) -> int:
    """Global batches the shard set holds (one pass, no repetition), through the mixtures reader."""
    from mixtures import ShardReader
    return ShardReader(shard_set, global_batch_size=global_batch).steps_per_epoch


def phase1_config(ctx, sets: dict[str, str], tokenizer: str, run_dir: Path, seq_len: int) -> dict[str, Any]:
    """Phase 1: power schedule calibrated so the cap holds for the first ~1/22 of the tokens and the
    rate then falls 4.8x by the end of the phase (Puro: Hyperball 5e-2 -> 1.04e-2 over 438.8B)."""
    g = _size(ctx, "trainer_global_batch")
    steps = min(_size(ctx, "trainer_phase1_steps"), available_steps(sets["phase1-uniform"], g))
    lr_max, a, b = 5e-3, 4.0, -0.51
    n_cap = steps * g * seq_len / 4.8 ** (1 / -b)          # tokens where the power law meets the cap
    beta = lr_max * n_cap ** (-b) / a
    return {
        "run_dir": str(run_dir), "seed": 0,
        "model": {"preset": "tiny"},
        "data": {"train": sets["phase1-uniform"], "eval": sets["eval"], "tokenizer": tokenizer},
        "train": {"steps": steps, "global_batch": g, "micro_batch": g},
        "schedule": {"kind": "power", "a": a, "b": b, "lr_max": lr_max, "batch_size": round(beta, 6),
                     "warmup_steps": max(2, steps // 40)},
        "optim": {"matrix": "muonh", "matrix_lr_mult": 10.0},
        "checkpoint": {"every_steps": steps // 2, "keep_last": 2},
        "eval": {"every_steps": _size(ctx, "trainer_eval_every"), "sequences": _size(ctx, "trainer_eval_sequences")},
        "log": {"every_steps": max(1, steps // 8), "progress": "none"},
    }


def run(ctx) -> dict[str, Any]:
    from trainer.checkpoint import read_state, resolve_checkpoint
    from trainer.config import load_run_config
    from trainer.export import export_hf
    from trainer.plots import plot_runs
    from trainer.train import train
    from trainer.variants import phase2_config

    mix = ctx.result("mixtures")
    sets, tokenizer, seq_len = mix["sets"], mix["tokenizer"], int(mix["seq_len"])
    out = ctx.stage_dir()

    # ---- phase 1 ------------------------------------------------------------------------------
    p1_cfg = load_run_config(None, data=phase1_config(ctx, sets, tokenizer, out / "phase1", seq_len))
    _write(p1_cfg, out / "phase1.yaml")
    ctx.step(f"phase 1: tiny preset, {p1_cfg.train.steps} steps x {p1_cfg.train.global_batch} x {seq_len} tokens on "
             f"phase1-uniform, MuonH x10 + AdamW, power schedule")
    p1 = train(p1_cfg)
    p1_ckpt = resolve_checkpoint(out / "phase1")
    p1_state = read_state(p1_ckpt)
    ctx.step(f"phase 1 done: held-out loss {p1['eval_loss']:.4f}; base rate {p1_cfg.schedule.lr_max:.1e} -> "
             f"{p1_state.schedule.lr_base_next:.2e} (MuonH x10)")

    # ---- phase 2: UD, CD, CMA from the same phase-1 checkpoint ----------------------------------
    n2, cont, spacing = _size(ctx, "trainer_phase2_steps"), _size(ctx, "trainer_continue_steps"), _size(ctx, "trainer_avg_spacing")
    have = min(available_steps(sets["phase2-curriculum"], p1_cfg.train.global_batch),
               available_steps(sets["phase2-uniform"], p1_cfg.train.global_batch))
    if int(0.8 * n2) + cont > have:                   # a smaller corpus: shrink phase 2, keep its proportions
        scale = have / (int(0.8 * n2) + cont)
        n2, cont = max(2, int(n2 * scale)), max(1, int(cont * scale))
        spacing = max(1, min(spacing, cont // 5))
        ctx.step(f"phase-2 sets hold {have} global batches: phase 2 shrunk to {n2} steps, continuation {cont}")
    resume = int(0.8 * n2)
    cont = max(cont, 5 * spacing)                     # the 6 averaged checkpoints lie in the constant tail
    base = {k: v for k, v in p1_cfg.dump().items() if k not in ("run_dir", "init_from", "schedule", "checkpoint", "log")}
    base["data"].pop("train")
    base["schedule"] = {"kind": "linear", "lr_start": "init", "lr_end": 0.0}
    base["checkpoint"] = {"every_steps": spacing, "keep_last": 2}
    base["log"] = {"every_steps": max(1, n2 // 4), "progress": "none"}
    base["eval"] = {"every_steps": max(spacing, n2 // 4), "sequences": _size(ctx, "trainer_eval_sequences")}
    runs: dict[str, dict[str, Any]] = {}
    for variant in ("UD", "CD", "CMA"):
        cfg = phase2_config(variant, base=base, phase1_checkpoint=str(p1_ckpt), phase1_step=p1_state.step,
                            uniform=sets["phase2-uniform"], curriculum=sets["phase2-curriculum"],
                            run_dir=str(out / variant.lower()), decay_steps=n2, resume_step=resume,
                            continue_steps=cont, average_n=6, average_spacing=spacing)
        _write(cfg, out / f"{variant.lower()}.yaml")
        tail = (f"decay to step {p1_state.step + resume} then constant for {cont} steps, average of the last 6 "
                f"checkpoints {spacing} apart" if variant == "CMA" else f"linear decay over {n2} steps")
        ctx.step(f"phase 2 {variant}: {Path(cfg.data.train).name}, {tail}")
        summary = train(cfg)
        runs[variant] = {
            "config": str(out / f"{variant.lower()}.yaml"), "run_dir": summary["run_dir"],
            "metrics": summary["metrics"], "checkpoint": summary["checkpoint"],
            "checkpoints": str(Path(summary["run_dir"]) / "checkpoints"), "eval_loss": summary["eval_loss"],
        }
        if variant == "CMA":
            runs["CMA"]["average"] = summary["average"]
            runs["CMA"]["cdc_eval_loss"] = summary["eval_loss"]          # the run's endpoint = CDC
            runs["CMA"]["eval_loss"] = summary["average_eval_loss"]
        ctx.step(f"phase 2 {variant} done: held-out loss {runs[variant]['eval_loss']:.4f}"
                 + (f" (CDC endpoint {summary['eval_loss']:.4f})" if variant == "CMA" else ""))

    plot = plot_runs({v: r["metrics"] for v, r in runs.items()}, out / "phase2_lr_loss.png",
                     title="Phase 2 from the same phase-1 checkpoint: UD, CD, CMA")
    ctx.step(f"LR and loss curves of UD, CD, CMA: {plot}")

    # ---- export the CMA model and load it back with transformers ------------------------------
    export_dir = export_hf(runs["CMA"]["average"], out / "hf-cma", tokenizer=tokenizer)
    check = load_back(export_dir, runs["CMA"]["average"])
    ctx.step(f"exported the CMA average to {export_dir}; transformers loads it as {check['class']}, "
             f"max |logit diff| vs the trainer {check['max_logit_diff']:.1e}; greedy: {check['sample']!r}")
    return {
        "phase1": {"config": str(out / "phase1.yaml"), "run_dir": p1["run_dir"], "metrics": p1["metrics"],
                   "checkpoint": str(p1_ckpt), "eval_loss": p1["eval_loss"]},
        "runs": runs,
        "held_out_loss": {"phase1": p1["eval_loss"], "UD": runs["UD"]["eval_loss"], "CD": runs["CD"]["eval_loss"],
                          "CDC": runs["CMA"]["cdc_eval_loss"], "CMA": runs["CMA"]["eval_loss"]},
        "metrics": {v: r["metrics"] for v, r in runs.items()},
        "plot": plot, "export": str(export_dir), "export_check": check,
    }


def load_back(export_dir: Path, checkpoint: str) -> dict[str, Any]:
    """Load the export with transformers, compare its logits with the trainer's model on a prompt
    (fp32 compute on the same BF16 weights) and decode a short greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.checkpoint import load_weights, read_state
    from trainer.model import ModelConfig, Transformer

    hf = AutoModelForCausalLM.from_pretrained(str(export_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(export_dir))
    ours = Transformer(ModelConfig.model_validate(read_state(checkpoint).model))
    ours.load_state_dict(load_weights(checkpoint), strict=False)
    ours.eval()
    ids = tok("The", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
        gen = hf.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id or tok.eos_token_id)
    return {"class": type(hf).__name__, "max_logit_diff": diff,
            "sample": tok.decode(gen[0], skip_special_tokens=True)}


def summary(result: dict[str, Any]) -> list[str]:
    h = result["held_out_loss"]
    lines = [f"held-out loss: phase 1 {h['phase1']:.4f}; phase 2 UD {h['UD']:.4f}, CD {h['CD']:.4f}, "
             f"CDC {h['CDC']:.4f}, CMA (average) {h['CMA']:.4f}"]
    for v, r in result["runs"].items():
        lines.append(f"{v}: {r['run_dir']} (config {r['config']})")
    lines.append(f"LR and loss curves: {result['plot']}")
    lines.append(f"Hugging Face export of the CMA model: {result['export']}")
    return lines
