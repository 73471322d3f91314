"""MuonH vs Muon vs ELR-aligned Muon vs AdamW on CPU: held-out loss after the same tokens on the
same shards (Puro §3.3; its 170M diagnostic: MuonH 3.029, ELR-aligned Muon 3.030, ordinary Muon 3.073).

Data: by default the English long descriptions in the installed packages' METADATA files (real
prose present wherever the project is installed), tokenized with a byte-level BPE trained by
`mixtures.tokenizers.train_bpe` and written as shard sets by `mixtures.write_token_lists`
(95% train / 5% held out, split by package so no text is shared). `--train/--eval` use existing
shard sets instead (e.g. the demo's runs/demo/mixtures/shards/phase1-uniform and eval).

Every optimizer gets the same model init, data order, token budget, WSD schedule and a small grid
of base learning rates (its best is reported, all are listed): the matrix rules run at m = 10 x base
(Puro), AdamW at base.

    .venv/bin/python benchmarks/optimizers_cpu.py --out benchmarks/_work/optimizers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RULES = {                      # name -> optim config (the base-LR grid is per rule)
    "muonh": {"matrix": "muonh", "matrix_lr_mult": 10.0},
    "muon_elr": {"matrix": "muon_elr", "matrix_lr_mult": 10.0, "muon_weight_decay": 0.1},
    "muon": {"matrix": "muon", "matrix_lr_mult": 10.0, "muon_weight_decay": 0.1},
    "adamw": {"matrix": "adamw", "adam_weight_decay": 0.1},
}
GRID = {"muonh": [1e-3, 3e-3, 1e-2], "muon_elr": [1e-3, 3e-3, 1e-2], "muon": [1e-3, 3e-3, 1e-2],
        "adamw": [1e-3, 3e-3, 1e-2]}


def metadata_texts(min_chars: int = 400) -> list[tuple[str, str]]:
    """(package, long description) for every installed distribution, sorted by name."""
    out = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        body = dist.metadata.get_payload() if hasattr(dist.metadata, "get_payload") else None
        body = body or dist.metadata.get("Description") or ""
        if name and len(body) >= min_chars and name not in out:
            out[name] = body
    return sorted(out.items())


def build_shards(work: Path, vocab: int, seq_len: int) -> tuple[str, str, str, dict]:
    from mixtures import write_token_lists
    from mixtures.tokenizers import train_bpe

    texts = metadata_texts()
    held = [t for i, (_, t) in enumerate(texts) if i % 20 == 0]
    train = [t for i, (_, t) in enumerate(texts) if i % 20 != 0]
    tok = train_bpe(train, vocab, work / "tokenizer", name="metadata-bpe")
    tr = write_token_lists(work / "train", tok.encode_batch(train), seq_len=seq_len, tokenizer=tok.identity)
    ev = write_token_lists(work / "heldout", tok.encode_batch(held), seq_len=seq_len, tokenizer=tok.identity)
    info = {"packages": len(texts), "train_tokens": tr.n_tokens, "heldout_tokens": ev.n_tokens,
            "vocab": tok.vocab_size}
    return str(work / "train"), str(work / "heldout"), str(work / "tokenizer" / "tokenizer.json"), info


def run_one(rule: str, lr: float, args, train_dir: str, eval_dir: str, out: Path) -> dict:
    from trainer.config import load_run_config
    from trainer.train import train

    run_dir = out / "runs" / f"{rule}-lr{lr:g}"
    cfg = load_run_config(None, data={
        "run_dir": str(run_dir), "seed": 0,
        "model": {"preset": args.preset},
        "data": {"train": train_dir, "eval": eval_dir, "seq_len": args.seq_len, "loop": True},
        "train": {"steps": args.steps, "global_batch": args.batch, "micro_batch": args.batch},
        "schedule": {"kind": "wsd", "lr": lr, "warmup_steps": max(1, args.steps // 10), "decay_ratio": 0.2},
        "optim": RULES[rule],
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "eval": {"every_steps": 0, "sequences": args.eval_sequences},
        "log": {"progress": "none"},
    })
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    s = train(cfg)
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train"]
    return {"rule": rule, "lr_base": lr, "eval_loss": s["eval_loss"], "final_train_loss": steps[-1]["loss"],
            "tokens": s["tokens_seen"], "wall_s": round(time.perf_counter() - t0, 1),
            "cpu_s": round(time.process_time() - cpu0, 1),
            "median_step_s": sorted(r["step_time_s"] for r in steps)[len(steps) // 2]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "_work" / "optimizers"))
    ap.add_argument("--train"), ap.add_argument("--eval")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-sequences", type=int, default=128)
    ap.add_argument("--rules", default="muonh,muon_elr,muon,adamw")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_info: dict = {}
    if args.train:
        train_dir, eval_dir = args.train, args.eval
    else:
        train_dir, eval_dir, _, data_info = build_shards(out / "data", args.vocab, args.seq_len)
    results = []
    for rule in args.rules.split(","):
        for lr in GRID[rule]:
            r = run_one(rule, lr, args, train_dir, eval_dir, out)
            results.append(r)
            print(json.dumps(r), flush=True)
    best = {}
    for r in results:
        if r["rule"] not in best or r["eval_loss"] < best[r["rule"]]["eval_loss"]:
            best[r["rule"]] = r
    load = os.getloadavg()
    report = {"args": vars(args), "data": data_info, "results": results, "best": best,
              "machine": {"cpus": os.cpu_count(), "loadavg_1_5_15": [round(x, 2) for x in load]}}
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print("\n| optimizer | best base LR | held-out loss | all (base LR: loss) |\n|---|---|---|---|")
    for rule, r in sorted(best.items(), key=lambda kv: kv[1]["eval_loss"]):
        grid = ", ".join(f"{x['lr_base']:g}: {x['eval_loss']:.4f}" for x in results if x["rule"] == rule)
        print(f"| {rule} | {r['lr_base']:g} | {r['eval_loss']:.4f} | {grid} |")
    print(f"\ndata: {data_info or {'train': train_dir, 'eval': eval_dir}}; load average {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
