"""`python -m trainer <command>`

  train     --config run.yaml [key.sub=value ...] [--allow-config-change KEY,...]   train or resume
                                                      (also under torchrun)
  average   --checkpoints DIR --out DIR [--n 6 --spacing 100]   CMA: average the last n checkpoints
  export    --checkpoint DIR --out DIR [--tokenizer PATH]       Hugging Face Qwen3ForCausalLM directory
  import-hf DIR --out CKPT [--vocab-multiple N] [--accept X,...] a Hugging Face Qwen3 model as a checkpoint
  schedule  [--config run.yaml | --kinds ...] --out lr.png      plot learning-rate schedules
  params    --preset 1.7b [--vocab N]                            parameter counts and MuonH routing
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from purokit.cli import Command, UsageError, dispatch
from purokit.errors import ContractError

_DTYPES = ("bfloat16", "float32", "float16")      # torch dtypes by name (torch loads with the command)


def _dtype(name: str):
    import torch

    return getattr(torch, name)


def cmd_train(args) -> int:
    from trainer.train import train

    summary = train(args.cfg, allow_config_change=tuple(args.allow_config_change))
    if summary and int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({k: summary[k] for k in ("run_dir", "step", "tokens_seen", "eval_loss", "checkpoint")}))
    return 0


def cmd_average(args) -> int:
    from trainer.average import average_checkpoints, average_last

    if not (args.checkpoints or args.sources):
        raise UsageError("average needs --checkpoints or --sources")
    for path in args.sources or [args.checkpoints]:
        if not os.path.isdir(path):
            raise ContractError(path, "no such checkpoint directory")
    dtype = _dtype(args.dtype)
    if args.sources:
        out = average_checkpoints(args.sources, args.out, dtype)
    else:
        out = average_last(args.checkpoints, args.out, n=args.n, spacing=args.spacing, dtype=dtype)
    from trainer.checkpoint import read_state
    st = read_state(out)
    print(json.dumps({"out": str(out), "steps": [s["step"] for s in st.sources], "dtype": args.dtype}))
    return 0


def cmd_export(args) -> int:
    from trainer.export import export_hf

    out = export_hf(args.checkpoint, args.out, tokenizer=args.tokenizer, dtype=_dtype(args.dtype),
                    eos_token=args.eos_token)
    print(json.dumps({"out": str(out)}))
    return 0


def cmd_import_hf(args) -> int:
    from trainer.hf import import_hf

    out = import_hf(args.directory, args.out, vocab_multiple=args.vocab_multiple, accept=args.accept)
    print(json.dumps({"checkpoint": str(out)}))
    return 0


def cmd_schedule(args) -> int:
    from trainer.plots import plot_schedules

    out = plot_schedules(args.out, config=args.config, overrides=args.overrides, steps=args.steps,
                         tokens_per_step=args.tokens_per_step)
    print(json.dumps(out))
    return 0


def cmd_params(args) -> int:
    from trainer.model import build_model, count_params, preset_config
    from trainer.optim import is_matrix_role, route_params

    over = {"vocab_size": args.vocab} if args.vocab else {}
    model = build_model(preset_config(args.preset, **over), device="meta")
    counts = count_params(model)
    routed = route_params(model.named_parameters())
    counts["muonh"] = sum(p.numel() for role, items in routed.items() if is_matrix_role(role) for _, p in items)
    counts["adamw"] = counts["total"] - counts["muonh"]
    counts["by_role"] = {role: sum(p.numel() for _, p in items) for role, items in routed.items()}
    print(json.dumps({"preset": args.preset, **counts}, indent=2))
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _key_list(text: str) -> list[str]:
    return [k for k in text.split(",") if k]


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-config-change", action="extend", default=[], metavar="KEY[,KEY...]", type=_key_list,
                   help="config keys a resume may change although they alter the model or the data order "
                        "(d_model, precision, global_batch, seed, seq_len, ...)")


def _average_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoints", help="a run dir or its checkpoints/ dir")
    p.add_argument("--sources", nargs="*", help="explicit checkpoint dirs instead of --checkpoints")
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--spacing", type=int, default=100, help="steps between averaged checkpoints (0: any)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="checkpoint dir, checkpoints dir or run dir (latest)")
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", help="tokenizer dir or tokenizer.json (default: the run's shard-set tokenizer)")
    p.add_argument("--eos-token", default=None)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))


def _import_hf_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="a Qwen3ForCausalLM directory (config.json, model.safetensors), tied or untied")
    p.add_argument("--out", required=True, help="checkpoints dir: writes OUT/step_00000000 (use as init_from.path)")
    p.add_argument("--vocab-multiple", type=_positive_int, default=None,
                   help="pad the vocabulary to a multiple (e.g. 128)")
    p.add_argument("--accept", action="extend", default=[], metavar="X[,X...]", type=_key_list,
                   help="import although the model cannot express it: rope_scaling (plain RoPE), sliding_window "
                        "(full attention), tie_word_embeddings (lm_head from the embedding), nonfinite (NaN/Inf kept)")


def _schedule_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="plot this run's schedule (base and matrix-group rates)")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=1000, help="horizon for the gallery (without --config)")
    p.add_argument("--tokens-per-step", type=int, default=6_291_456)


def _params_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", required=True)
    p.add_argument("--vocab", type=int, default=None)


def _load_run_config(path: str, overrides: list[str]):
    from trainer.config import load_run_config

    return load_run_config(path, overrides)


COMMANDS = {
    "train": Command(cmd_train, "train or resume a run", _train_args, config=_load_run_config),
    "average": Command(cmd_average, "CMA: equal-weight average of checkpoints (BF16)", _average_args),
    "export": Command(cmd_export, "write a Hugging Face Qwen3ForCausalLM directory", _export_args),
    "import-hf": Command(cmd_import_hf, "a Hugging Face Qwen3 model directory as a trainer checkpoint",
                         _import_hf_args),
    "schedule": Command(cmd_schedule, "plot learning-rate schedules", _schedule_args),
    "params": Command(cmd_params, "parameter counts of a preset", _params_args),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv, prog="python -m trainer")


if __name__ == "__main__":
    sys.exit(main())
