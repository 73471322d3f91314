"""`python -m mixtures <command>`

  validate        --spec mixture.yaml [key=value ...]
        check a spec (schema, names, weights, components on disk, score fields) before any work
  materialize     --spec mixture.yaml --out shards/ [--sets a,b] [--force] [key=value ...]
        write every shard set of the spec locally (streaming); the same sets at scale:
        spark-submit kaiyuan/jobs/materialize.py --spec mixture.yaml --out shards/
  inspect         shards/ [--plots DIR] [--verify]
        per-segment composition and mean rank of each set; PNG plots
  train-tokenizer --components DIR [DIR ...] --vocab-size N --out DIR [--max-docs N]
        train a byte-level BPE (tokenizers) on a sample of components
  sft             --config sft.yaml --out shards/sft [key=value ...]
        render chat records into tokens + assistant-only loss masks and pack them
  export          SET --format megatron|hf|nanotron --out DIR
        write a shard set's documents, in stream order, as Megatron-LM's indexed dataset,
        a Hugging Face datasets directory (arrow + parquet) or datatrove/nanotron .ds files
  megatron-order  CACHE_DIR
        rewrite the indices Megatron's GPTDataset cached under --data-cache-path for our
        megatron exports to the export's order (Megatron shuffles and has no flag against it)
"""

from __future__ import annotations

import argparse
import sys

from purokit import storage
from purokit.cli import Command, dispatch, job_notes


def _spec(path: str, overrides: list[str]):
    from mixtures.spec import load_spec

    return load_spec(path, overrides)


def _sft_config(path: str, overrides: list[str]):
    from purokit.config import load_config
    from mixtures.sft import SftConfig

    return load_config(SftConfig, path, overrides)


def _validate(args) -> int:
    from mixtures.spec import check_components

    spec = args.cfg
    comps = check_components(spec, args.config)
    print(f"{args.config}: valid (spec {spec.spec_hash()[:12]})")
    for c in spec.components:
        m = comps[c.name].manifest
        score = f"{c.score_field} ({'higher' if c.higher_is_better else 'lower'} is better)" if c.score_field else "unscored"
        print(f"  {c.name}: {m.n_docs:,} docs, {score}, retention {c.retention.rule}, repeat {c.repeat}")
    for p in spec.phases:
        shares = ", ".join(f"{n}={s.weight:g}" if s.weight is not None else
                           (f"{n}={s.n_tokens:,} tokens" if s.n_tokens else f"{n}=all") for n, s in p.components.items())
        trans = f", transition {p.transition_tokens:,} tokens" if p.transition_tokens else ""
        print(f"  phase {p.name}: {', '.join(p.orders)}, K={spec.bucket_count_of(p)}{trans}: {shares}")
    return 0


def _materialize_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--sets", default="", help="comma-separated set names (default: all)")
    ap.add_argument("--work-dir", default=None)
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--force", action="store_true", help="rewrite sets that are complete")


def _materialize(args) -> int:
    from mixtures.materialize import materialize

    results = materialize(args.cfg, args.out, sets=[s for s in args.sets.split(",") if s] or None,
                          work_dir=args.work_dir, keep_work=args.keep_work, force=args.force, progress=job_notes())
    for name, m in results.items():
        print(f"{name}: {m.n_tokens:,} tokens, {m.n_docs:,} docs, {len(m.shards)} shards -> {storage.join(args.out, name)}")
    return 0


def _inspect_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("path", help="a shard set, or a directory of shard sets")
    ap.add_argument("--plots", default=None, help="directory for PNG plots")
    ap.add_argument("--verify", action="store_true", help="re-hash every file")


def _inspect(args) -> int:
    from mixtures.inspect import inspect_sets

    lines, plots, failures = inspect_sets(args.path, args.plots, verify=args.verify)
    print("\n".join(lines))
    for p in plots:
        print(f"plot: {p}")
    for f in failures:
        print(f"error: {f}", file=sys.stderr)
    return 1 if failures else 0


def _train_tokenizer_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--components", nargs="+", required=True, help="component directories")
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-docs", type=int, default=20_000, help="documents sampled per component")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-frequency", type=int, default=2)


def _train_tokenizer(args) -> int:
    from mixtures.tokenizers import sample_component_texts, train_bpe

    texts = sample_component_texts(args.components, args.max_docs, args.seed)
    tok = train_bpe(texts, args.vocab_size, args.out, min_frequency=args.min_frequency)
    print(f"{args.out}/tokenizer.json: vocab {tok.vocab_size}, eos {tok.eos_id}, digest {tok.identity.digest[:12]}")
    return 0


def _sft_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true")


def _sft(args) -> int:
    from mixtures.sft import materialize_sft

    m = materialize_sft(args.cfg, args.out, progress=job_notes(), force=args.force)
    print(f"{args.out}: {m.n_tokens:,} tokens, {m.counts['n_loss_tokens']:,} loss tokens, {len(m.shards)} shards")
    return 0


def _export_args(ap: argparse.ArgumentParser) -> None:
    from mixtures.export import FORMATS

    ap.add_argument("set", help="a shard set directory (or URL)")
    ap.add_argument("--format", required=True, help=f"one of {', '.join(FORMATS)}")
    ap.add_argument("--out", required=True, help="the export directory (or URL); must not exist")


def _export(args) -> int:
    from mixtures.export import export_set

    record = export_set(args.set, args.format, args.out, progress=job_notes())
    print(f"read it with: {record.read_with}")
    return 0


def _megatron_order(args) -> int:
    from mixtures.export import is_megatron_export
    from mixtures.megatron import keep_order

    done = keep_order(args.cache_dir, is_megatron_export, progress=job_notes())
    print(f"{len(done)} cached GPTDataset index set(s) now in the export's order")
    return 0 if done else 1


COMMANDS = {
    "validate": Command(_validate, "check a spec before any work", config=_spec, config_flag="--spec"),
    "materialize": Command(_materialize, "write every shard set of the spec locally", _materialize_args,
                           config=_spec, config_flag="--spec"),
    "inspect": Command(_inspect, "per-segment composition and mean rank of each set", _inspect_args),
    "train-tokenizer": Command(_train_tokenizer, "train a byte-level BPE on a sample of components",
                               _train_tokenizer_args),
    "sft": Command(_sft, "render chat records into tokens + loss masks and pack them", _sft_args,
                   config=_sft_config),
    "export": Command(_export, "a shard set as Megatron / HF datasets / nanotron files", _export_args),
    "megatron-order": Command(_megatron_order, "rewrite Megatron's cached indices to the export's order",
                              lambda ap: ap.add_argument("cache_dir", help="Megatron's --data-cache-path")),
}


def main(argv: list[str] | None = None) -> int:
    return dispatch(__doc__, COMMANDS, argv, prog="python -m mixtures")


if __name__ == "__main__":
    sys.exit(main())
