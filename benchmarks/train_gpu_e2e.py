"""End-to-end GPU training benchmarks of the trainer: BF16 against blockwise FP8, same run, same GPU.

Built from the trainer's own parts (``trainer.model`` presets, ``build_optimizer`` = MuonH + AdamW,
``token_losses``, ``convert_to_fp8``) with the training loop's step (autocast BF16, gradient
accumulation, global-norm clipping at 1.0, optimizer step), timed phase by phase with CUDA events.
``torch.compile`` wraps the model and its loss (so Inductor fuses the cross-entropy and, under FP8,
the quantization into neighbouring ops).

Subcommands:

- ``throughput``: tokens/s, MFU (``trainer.flops`` convention: model FLOPs against the BF16 dense
  peak, and for FP8 also against the precision-weighted peak), peak memory, and the optimizer step's
  share of the step time, for each precision in turn; optionally a PyTorch-profiler kernel table.
  Random tokens (throughput does not depend on the data).
- ``quality``: trains the same preset from the same seed on the same token stream in each precision
  for the same number of tokens and reports the held-out loss (``benchmarks/gpu_corpus.py`` builds
  the corpus; the stream is its train split read sequentially, the held-out split is never trained on).
- ``ddp``: ``throughput`` under ``torchrun`` (DistributedDataParallel, NCCL; MuonH's Newton-Schulz
  split across ranks by ``MatrixOptimizer``), at a fixed per-GPU micro-batch and accumulation.

Examples (on the GPU):
    python benchmarks/train_gpu_e2e.py throughput --preset 1.7b --micro-batch 4 --accum 8 --out $OUT
    python benchmarks/train_gpu_e2e.py quality --preset 150m --corpus .gpu_data/corpus.npz --tokens 7000000 --out $OUT
    torchrun --nproc-per-node 2 benchmarks/train_gpu_e2e.py ddp --preset 1.7b --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.flops import H200, shape_from_config, throughput_report  # noqa: E402
from trainer.fp8 import Fp8Recipe, convert_to_fp8  # noqa: E402
from trainer.model import build_model, preset_config, token_losses  # noqa: E402
from trainer.optim import OptimConfig, build_optimizer  # noqa: E402

# "fp8" uses --quantizer (auto: the torch ops under torch.compile); the suffixed ones force a quantizer
PRECISIONS = ("bf16", "fp8", "fp8-triton", "fp8-torch")


class LossModel(nn.Module):
    """model + mean token loss under BF16 autocast, so that one compiled graph holds both."""

    def __init__(self, model: nn.Module, device_type: str = "cuda"):
        super().__init__()
        self.model = model
        self.device_type = device_type

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            logits = self.model(inputs)
        return token_losses(logits, targets).mean()


def log(msg: str) -> None:
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build(args, precision: str, vocab: int, device: torch.device):
    cfg = preset_config(args.preset, vocab_size=vocab, max_seq_len=max(args.seq, 128))
    torch.manual_seed(args.seed)
    model = build_model(cfg, seed=args.seed, device=device)
    if precision.startswith("fp8"):
        quantizer = precision.split("-", 1)[1] if "-" in precision else args.quantizer
        convert_to_fp8(model, Fp8Recipe(scale_format=args.scale_format, quantizer=quantizer))
    optimizer = build_optimizer(model, OptimConfig(ns_dtype="bfloat16"))
    step_model: nn.Module = LossModel(model, device.type)
    if args.compile:
        step_model = torch.compile(step_model)
    if dist.is_initialized():
        from torch.nn.parallel import DistributedDataParallel as DDP

        step_model = DDP(step_model, device_ids=[device.index] if device.type == "cuda" else None)
    return cfg, model, step_model, optimizer


class Timer:
    """CUDA events at phase boundaries of one step (no host syncs added); wall clock on CPU."""

    def __init__(self):
        self.cuda = torch.cuda.is_available()
        self.events: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        else:
            ev = time.perf_counter()
        self.events.append((name, ev))

    def _ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def phases_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.events, self.events[1:]):
            out[name] = self._ms(a, b)
        out["total"] = self._ms(self.events[0][1], self.events[-1][1])
        return out


def train_step(step_model, model, optimizer, batches, lr_base: float) -> tuple[float, dict[str, float]]:
    """One optimizer step over ``batches`` (list of (inputs, targets)) as the training loop does it."""
    timer = Timer()
    timer.mark("start")
    optimizer.set_lr(lr_base)
    total = torch.zeros((), device=batches[0][0].device)
    n = len(batches)
    for i, (inputs, targets) in enumerate(batches):
        sync = i == n - 1
        ctx = step_model.no_sync() if (isinstance(step_model, nn.parallel.DistributedDataParallel) and not sync) else contextlib.nullcontext()
        with ctx:
            loss = step_model(inputs, targets)
            (loss / n).backward()
        total += loss.detach()
    timer.mark("forward_backward")
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    timer.mark("clip")
    optimizer.step()
    timer.mark("optimizer")
    optimizer.zero_grad(set_to_none=True)
    timer.mark("zero_grad")
    phases = timer.phases_ms()
    return float(total) / n, phases


def random_batches(args, vocab: int, gen: torch.Generator, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(args.accum):
        t = torch.randint(0, vocab, (args.micro_batch, args.seq + 1), device=device, generator=gen)
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out


def profile_step(step_model, model, optimizer, batches, path: Path, title: str) -> None:
    """Append the CUDA-time table of one profiled step to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        train_step(step_model, model, optimizer, batches, 1e-3)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=100)
    with path.open("a") as f:
        f.write(f"==== {title}\n{table}\n")


# -------------------------------------------------------------------------------------------- throughput


def _device(args) -> torch.device:
    if args.device == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    return device


def _reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_throughput(args) -> dict:
    device = _device(args)
    world = dist.get_world_size() if dist.is_initialized() else 1
    vocab = args.vocab
    results = {}
    out = Path(args.out)
    for precision in args.precisions:
        _reset_memory(device)
        t0 = time.perf_counter()
        cfg, model, step_model, optimizer = build(args, precision, vocab, device)
        gen = torch.Generator(device=device).manual_seed(1234 + (dist.get_rank() if dist.is_initialized() else 0))
        batches = random_batches(args, vocab, gen, device)
        log(f"{precision}: built {args.preset} in {time.perf_counter() - t0:.1f}s; warming up (compile)")
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            train_step(step_model, model, optimizer, batches, 1e-3)
        warm_s = time.perf_counter() - t0
        _reset_memory(device)
        steps = []
        for _ in range(args.steps):
            loss, phases = train_step(step_model, model, optimizer, batches, 1e-3)
            steps.append(phases)
        tokens_per_step = args.micro_batch * args.accum * args.seq * world
        med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
        shape = shape_from_config(cfg)
        rep = throughput_report(shape, args.seq, tokens_per_step, med["total"] / 1e3, fp8=precision.startswith("fp8"),
                                peaks=H200, n_gpus=world)
        res = {
            "precision": precision, "preset": args.preset, "seq": args.seq, "micro_batch": args.micro_batch,
            "accum": args.accum, "world": world, "tokens_per_step": tokens_per_step, "compile": args.compile,
            "warmup_s": warm_s, "step_ms_median": med["total"], "phases_ms_median": med,
            "step_ms_all": [s["total"] for s in steps], "loss_last": loss,
            "optimizer_share": med["optimizer"] / med["total"],
            "peak_mem_allocated_GiB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "peak_mem_reserved_GiB": torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None,
            **rep,
        }
        results[precision] = res
        log(json.dumps(res))
        if args.profile and device.type == "cuda" and (not dist.is_initialized() or dist.get_rank() == 0):
            profile_step(step_model, model, optimizer, batches, out / f"profile_{args.preset}_w{world}{args.tag}.txt",
                         f"{args.preset} {precision} world {world} micro-batch {args.micro_batch} x accum {args.accum}")
            log(f"{precision}: profile written")
        del model, step_model, optimizer, batches
        torch._dynamo.reset()
        for name in results:
            if name.startswith("fp8") and "bf16" in results:
                results[name]["over_bf16_tokens_per_s"] = results[name]["tokens_per_s"] / results["bf16"]["tokens_per_s"]
        _write(args, results, partial=True)
    return results


# -------------------------------------------------------------------------------------------- quality


class CorpusStream:
    """Sequential windows of seq+1 tokens over a token array; every rank and precision sees the same
    windows in the same order (no shuffling: a fixed curriculum, as the trainer's shard reader)."""

    def __init__(self, tokens, seq: int, micro_batch: int, device: torch.device):
        self.device = device
        self.tokens = torch.from_numpy(tokens.astype("int64"))
        self.seq, self.mb = seq, micro_batch
        self.n_windows = (self.tokens.numel() - 1) // seq
        self.cursor = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for _ in range(self.mb):
            i = self.cursor % self.n_windows
            rows.append(self.tokens[i * self.seq:i * self.seq + self.seq + 1])
            self.cursor += 1
        t = torch.stack(rows).to(self.device, non_blocking=True)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()


@torch.no_grad()
def heldout_loss(step_model, tokens, seq: int, micro_batch: int, device: torch.device) -> float:
    stream = CorpusStream(tokens, seq, micro_batch, device)
    n_batches = stream.n_windows // micro_batch
    total = 0.0
    for _ in range(n_batches):
        inputs, targets = stream.next()
        total += float(step_model(inputs, targets))
    return total / n_batches


def run_quality(args) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_corpus import load

    train, held, meta = load(args.corpus)
    device = _device(args)
    vocab = meta["vocab_size"]
    tokens_per_step = args.micro_batch * args.accum * args.seq
    n_steps = max(1, args.tokens // tokens_per_step)
    warm = max(1, int(0.05 * n_steps))
    results = {"corpus": meta, "n_steps": n_steps, "tokens_trained": n_steps * tokens_per_step,
               "tokens_per_step": tokens_per_step, "lr_base_peak": args.lr, "schedule": f"linear warmup {warm} steps, then linear decay to 0"}
    for precision in args.precisions:
        cfg, model, step_model, optimizer = build(args, precision, vocab, device)
        stream = CorpusStream(train, args.seq, args.micro_batch, device)
        curve = []
        t0 = time.perf_counter()
        for step in range(n_steps):
            lr = args.lr * min(1.0, (step + 1) / warm) * min(1.0, (n_steps - step) / max(1, n_steps - warm))
            batches = [stream.next() for _ in range(args.accum)]
            loss, _ = train_step(step_model, model, optimizer, batches, lr)
            if not math.isfinite(loss):
                raise FloatingPointError(f"{precision}: loss {loss} at step {step}")
            if step % max(1, n_steps // 20) == 0 or step == n_steps - 1:
                curve.append((step, loss))
                log(f"{precision} step {step}/{n_steps} loss {loss:.4f}")
        train_s = time.perf_counter() - t0
        step_model.eval()
        held_loss = heldout_loss(step_model, held, args.seq, args.micro_batch, device)
        results[precision] = {"heldout_loss": held_loss, "train_curve": curve, "train_s": train_s,
                              "final_train_loss": curve[-1][1]}
        log(f"{precision}: held-out loss {held_loss:.4f} ({train_s:.0f}s)")
        del model, step_model, optimizer
        torch._dynamo.reset()
        _reset_memory(device)
        _write(args, results, partial=True)
    if "bf16" in results and "fp8" in results:
        b, f = results["bf16"]["heldout_loss"], results["fp8"]["heldout_loss"]
        results["fp8_minus_bf16"] = f - b
        results["relative_difference"] = (f - b) / b
    return results


# -------------------------------------------------------------------------------------------- main


def _write(args, results: dict, partial: bool = False) -> None:
    """Write the results JSON (rank 0), after every precision so that a cut-off run keeps its part."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    world = dist.get_world_size() if dist.is_initialized() else 1
    path = Path(args.out) / f"e2e_{args.command}_{args.preset}_w{world}{args.tag}.json"
    path.write_text(json.dumps({**results, "partial": partial}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("throughput", "quality", "ddp"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="1.7b" if name != "quality" else "150m")
        p.add_argument("--seq", type=int, default=4096)
        p.add_argument("--micro-batch", type=int, default=4)
        p.add_argument("--accum", type=int, default=8)
        p.add_argument("--precisions", nargs="+", default=["bf16", "fp8"], choices=PRECISIONS)
        p.add_argument("--scale-format", default="pow2", choices=["pow2", "fp32"])
        p.add_argument("--quantizer", default="auto", choices=["auto", "triton", "torch"])
        p.add_argument("--no-compile", dest="compile", action="store_false")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", default="bench_out")
        p.add_argument("--tag", default="")
        p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of the script")
        if name in ("throughput", "ddp"):
            p.add_argument("--vocab", type=int, default=151936)
            p.add_argument("--warmup", type=int, default=2)
            p.add_argument("--steps", type=int, default=5)
            p.add_argument("--profile", action="store_true")
        if name == "quality":
            p.add_argument("--corpus", default=".gpu_data/corpus.npz")
            p.add_argument("--tokens", type=int, default=7_000_000)
            p.add_argument("--lr", type=float, default=2e-3, help="peak base LR (MuonH runs at 10x)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if args.command == "ddp":
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    info = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv}
    log(json.dumps(info))
    if args.command == "quality":
        results = run_quality(args)
    else:
        results = run_throughput(args)
    results["info"] = info
    _write(args, results)
    log(f"wrote results under {out}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
