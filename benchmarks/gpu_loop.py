"""GPU throughput of the training loop users run, `python -m trainer train`, beside the peers.

Each variant of ours is one `python -m trainer train --config RUN.yaml` subprocess (the product CLI:
its run config, its shard reader, its compiled step), whose `metrics.jsonl` gives the per-step times,
MFU and peak memory; the peers (torchtitan 0.3.0 BF16, torchao blockwise FP8 in torchtitan) are
measured by `../shared/bench/peer_torchtitan/peer_bench.py` in the same call on the same GPU.

    # here (CPU), once: a shard set of real text (the Python standard library, Qwen BPE, compact ids)
    .venv/bin/python benchmarks/gpu_loop.py prepare --out .gpu_data
    # on the GPU (with .gpu_data, .peer and the wheels carried):
    python benchmarks/gpu_loop.py run --data .gpu_data/shards --out $OUT --peer .peer

`--profile` adds, last, a torch.profiler summary of two steps of ours-bf16 (the same loop, `trainer.train.train`,
in its own process; the compile step skipped): CUDA kernel time per step by family (GEMM, attention, optimizer
elementwise, Inductor kernels, other) and by region (the optimizer step with the gradient clip; the chunked loss),
and the top kernels (`profile.json`, `profile.txt`).

The model is the `1.7b` preset with the vocabulary padded to Qwen's 151,936 (`model.overrides.vocab_size`;
the shard set's own vocabulary is smaller), sequence 4096, 64 sequences = 262,144 tokens per step,
micro-batch 4; `compile: true`; no checkpoints, no evaluation. Tokens/s is the median over the steps
after `--skip` (the first step compiles). The quality check (FP8 against BF16 held-out loss, same
tokens) is the same command with a held-out set and the `150m` preset, e.g.
`--steps 27 --set ours-bf16:model.preset=150m --set ours-bf16:data.eval=.gpu_data/heldout
--set ours-bf16:eval.at_end=true` (and the same for ours-fp8-blockwise): `eval_loss` per variant. Output: `gpu_loop.json` in --out (and in
benchmarks/results/ when copied there): {"variants": {name: {tokens_per_s, step_ms, mfu, peak_mem_gib,
...}}, "ratios", "device", "date", "commit"}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OURS = {
    "ours-bf16": {"precision": "bf16"},
    "ours-fp8-blockwise": {"precision": "fp8-blockwise"},
}
PEER_NAMES = {"titan-bf16": "titan-bf16", "titan-fp8-blockwise": "torchao-blockwise-in-titan",
              "titan-fp8-tensorwise": "titan-fp8-tensorwise", "titan-fp8-rowwise": "titan-fp8-rowwise"}


def base_config(name: str) -> dict:
    """A variant's run-config settings: its own entry, or the BF16 / FP8 one its name says (ours-fp8-mb8 ...)."""
    return OURS.get(name) or (OURS["ours-fp8-blockwise"] if "fp8" in name else OURS["ours-bf16"])


def log(msg: str) -> None:
    print(f"[gpu_loop {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------- prepare


def prepare(out: Path, tokens: int) -> dict:
    """Shard set (mixtures writer) of the first `tokens` train tokens of benchmarks/gpu_corpus.py."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import numpy as np
    from gpu_corpus import build, load
    from mixtures import write_token_lists

    corpus = out / "corpus.npz"
    if not corpus.is_file():
        build(corpus)
    train, held, meta = load(corpus)
    eos = meta["eos_id"]

    def documents(tokens):
        cuts = np.flatnonzero(tokens == eos)
        return [tokens[a + 1:b] for a, b in zip(np.r_[-1, cuts], cuts) if b > a + 1]

    docs = documents(train[:tokens].astype(np.int64))
    write_token_lists(out / "shards", docs, seq_len=4096, vocab_size=meta["vocab_size"], eos_id=eos)
    write_token_lists(out / "heldout", documents(held.astype(np.int64)), seq_len=4096,
                      vocab_size=meta["vocab_size"], eos_id=eos)
    info = {"corpus": meta["source"], "tokens": int(min(tokens, train.size)), "documents": len(docs),
            "heldout_tokens": int(held.size), "vocab_size": meta["vocab_size"]}
    (out / "shards.json").write_text(json.dumps(info, indent=1))
    return info


# ---------------------------------------------------------------------------------------- run


def run_config(name: str, data: str, run_dir: Path, steps: int, micro_batch: int, extra: dict) -> dict:
    cfg = {
        "run_dir": str(run_dir),
        "model": {"preset": "1.7b", "overrides": {"vocab_size": 151936}},
        "data": {"train": data, "seq_len": 4096, "loop": True},
        "train": {"steps": steps, "global_batch": 64, "micro_batch": micro_batch},
        "schedule": {"kind": "constant", "lr": 1e-3, "warmup_steps": 2},
        "checkpoint": {"every_steps": 0, "at_end": False},
        "eval": {"at_end": False},
        "log": {"progress": "line", "every_steps": 1},
        "compile": True,
        "notes": {"benchmark": name},
    }
    for key, value in extra.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def summarize(metrics: Path, skip: int) -> dict:
    recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    evals = [r for r in recs if r.get("kind") == "eval" and r.get("model") != "average"]
    timed = train[skip:]
    if not timed:
        raise RuntimeError(f"{metrics}: {len(train)} train records, none after the first {skip}")
    step_s = [r["step_time_s"] for r in timed]
    med = statistics.median(step_s)
    tokens = timed[0]["tokens_per_s"] * timed[0]["step_time_s"]
    return {
        "tokens_per_s": tokens / med,
        "step_ms": 1e3 * med,
        "step_ms_all": [round(1e3 * r["step_time_s"], 1) for r in train],
        "step_ms_max_over_median": max(step_s) / med,
        "first_step_s": train[0]["step_time_s"],
        "mfu": statistics.median(r["mfu"] for r in timed) if "mfu" in timed[0] else None,
        "peak_mem_gib": max((r["peak_mem_gib"] for r in train if "peak_mem_gib" in r), default=None),
        "loss": [round(r["loss"], 4) for r in train],
        "tokens_per_step": int(round(tokens)),
        "eval_loss": evals[-1]["eval_loss"] if evals else None,
    }


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run_ours(name: str, args, extra: dict) -> dict:
    run_dir = Path(args.work) / name
    cfg_path = Path(args.work) / f"{name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    base = base_config(name)
    cfg = run_config(name, args.data, run_dir, args.steps, args.micro_batch, {**base, **extra})
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "trainer", "train", "--config", str(cfg_path)]
    log(f"{name}: {' '.join(cmd)}")
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.variant_timeout)
    except subprocess.TimeoutExpired as e:
        (Path(args.out) / f"{name}.log").write_text(_text(e.stdout) + _text(e.stderr))
        # the steps it finished are kept (labelled partial), not thrown away with the timeout
        metrics = run_dir / "metrics.jsonl"
        done = metrics.is_file() and sum(1 for line in metrics.read_text().splitlines() if '"train"' in line)
        if not done or done <= args.skip:
            raise
        res = summarize(metrics, args.skip)
        res.update(ok=False, partial=f"timed out after {args.variant_timeout} s with {done} of {args.steps} steps",
                   wall_s=round(time.time() - t0, 1), command=" ".join(cmd[1:]), config=cfg)
        return res
    (Path(args.out) / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-3000:], "wall_s": time.time() - t0}
    res = summarize(run_dir / "metrics.jsonl", args.skip)
    res.update(ok=True, wall_s=round(time.time() - t0, 1), command=" ".join(cmd[1:]), config=cfg)
    log(f"{name}: {res['tokens_per_s']:.0f} tokens/s, step {res['step_ms']:.0f} ms, mfu {res['mfu']}, "
        f"peak {res['peak_mem_gib']:.1f} GiB, steps {res['step_ms_all']}")
    return res


def run_peer(args) -> dict:
    peer = Path(args.peer)
    site = Path("/tmp/peer")
    wheels = sorted(str(w) for w in peer.glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", str(site), *wheels], check=True)
    out = Path(args.work) / "peer"              # its per-variant folders stay out of --out
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(peer / "peer_bench.py"), "--out", str(out), "--isolate", "--variants",
           args.peer_variants, "--steps", str(args.peer_steps), "--budget-s", str(args.peer_timeout - 40)]
    if args.peer_timeout - 40 < 90 * len(args.peer_variants.split(",")):
        log(f"peer: --peer-timeout {args.peer_timeout} leaves under ~90 s a variant; peer_bench.py may skip them")
    log("peer: " + " ".join(cmd))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.peer_timeout)
    (Path(args.out) / "peer.log").write_text(proc.stdout + proc.stderr)
    got = {}
    peer_json = out / "peer.json"
    if peer_json.is_file():
        (Path(args.out) / "peer.json").write_text(peer_json.read_text())
        data = json.loads(peer_json.read_text())
        for rec in data.get("variants", data.get("results", [])) if isinstance(data, dict) else data:
            if isinstance(rec, dict) and rec.get("variant") in PEER_NAMES:
                got[PEER_NAMES[rec["variant"]]] = {
                    "ok": rec.get("ok"), "tokens_per_s": rec.get("tokens_per_s"), "step_ms": rec.get("step_ms_median"),
                    "step_ms_all": rec.get("step_ms"), "mfu": rec.get("mfu_vs_bf16_peak"),
                    "peak_mem_gib": rec.get("peak_mem_gib"), "error": rec.get("error"),
                    "command": "peer_bench.py " + " ".join(cmd[2:])}
    return got


def attention_probe() -> dict:
    """Causal SDPA fwd+bwd at the 1.7B shape (4 x 16 heads x 4096 x 128, 8 KV heads) under the loop's
    backend order: grouped KV heads as given, and expanded to 16 (what the model does on CUDA)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from trainer.train import attention_context

    dev = torch.device("cuda")
    q = torch.randn(4, 16, 4096, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    kv = [torch.randn(4, 8, 4096, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    flops = 4 * 4 * 16 * 4096 * 4096 / 2 * 128 * 3.5          # causal fwd (2 products) + bwd (2.5x)
    out = {}
    for name, expand in (("gqa", False), ("expanded", True)):
        def step():
            k, v = kv
            if expand:
                k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            with attention_context(dev):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            y.sum().backward()
        ms = do_bench(step, warmup=50, rep=300, return_mode="median")
        out[name] = {"ms": ms, "tflops": flops / ms / 1e9}
    for name, b in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([b]):
                ms = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q, kv[0].repeat_interleave(2, 1), kv[1].repeat_interleave(2, 1), is_causal=True).sum().backward(),
                    warmup=50, rep=300, return_mode="median")
            out[f"{name}-only-expanded"] = {"ms": ms, "tflops": flops / ms / 1e9}
        except RuntimeError as e:
            out[f"{name}-only-expanded"] = {"error": str(e)[:300]}
    log(f"attention probe: {out}")
    return out


KERNEL_FAMILIES = (          # first match wins; names as cuBLAS, cuDNN, flash and Inductor give them
    ("attention", re.compile(r"sdpa|flash|fmha|attention|cudnn", re.I)),   # cuDNN runs only attention here
    ("gemm", re.compile(r"nvjet|gemm|cutlass|xmma|cublas|wgmma", re.I)),
    ("optimizer-elementwise", re.compile(r"multi_tensor|foreach|adam|lerp", re.I)),
    ("inductor (norms, RoPE, SwiGLU, residuals, loss softmax)", re.compile(r"^triton_", re.I)),
)
REGIONS = ("gpu_loop/clip", "gpu_loop/optimizer", "gpu_loop/loss")


def kernel_family(name: str) -> str:
    return next((fam for fam, pat in KERNEL_FAMILIES if pat.search(name)), "other (copies, casts, reductions)")


def profile_loop(cfg_path: Path, out: Path, steps: int) -> dict:
    """`trainer.train.train` (the loop `python -m trainer train` calls) under torch.profiler: the first
    step (compile) is skipped, the next `steps` are recorded. Kernel time by family and the top kernels;
    the gradient clip, the optimizer step and the chunked loss forward are wrapped in named ranges,
    whose spans on the GPU timeline are the regions' times (with the optimizers' own ranges)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    import trainer.step as ts
    import trainer.train as tt
    from trainer.config import load_run_config

    cfg = load_run_config(str(cfg_path), [])
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=1, warmup=0, active=steps, repeat=1))
    step_call, lce = tt.Stepper.__call__, ts.linear_cross_entropy_sum
    clip = torch.nn.utils.clip_grad_norm_

    def stepped(self, *a, **k):
        r = step_call(self, *a, **k)
        prof.step()
        return r

    def ranged(name, fn):
        def wrapper(*a, **k):
            with record_function(name):
                return fn(*a, **k)
        return wrapper

    from trainer import optim
    tt.Stepper.__call__ = stepped
    ts.linear_cross_entropy_sum = ranged("gpu_loop/loss", lce)
    torch.nn.utils.clip_grad_norm_ = ranged("gpu_loop/clip", clip)
    optim.CombinedOptimizer.step = ranged("gpu_loop/optimizer", optim.CombinedOptimizer.step)
    with prof:
        tt.train(cfg)
    t0 = time.time()
    fam: dict[str, float] = {}
    kernels: dict[str, list] = {}
    regions = dict.fromkeys(REGIONS, 0.0)
    for e in prof.key_averages():
        if not str(e.device_type).endswith("CUDA") or e.self_device_time_total <= 0:
            continue
        if e.is_user_annotation or e.key.startswith("ProfilerStep"):
            # a range's span on the GPU timeline (ours, the optimizers' own, the profiler's step), no kernel
            if e.key in REGIONS or e.key.startswith("Optimizer.step#"):
                regions[e.key] = regions.get(e.key, 0.0) + e.self_device_time_total
            continue
        f = kernel_family(e.key)
        fam[f] = fam.get(f, 0.0) + e.self_device_time_total
        kernels[e.key] = [e.self_device_time_total, e.count, f]
    total = sum(fam.values())
    per = lambda us: round(us / 1e3 / steps, 1)  # noqa: E731 - µs over `steps` steps -> ms per step
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:60]
    result = {"steps": steps, "ms_per_step_total_kernels": per(total),
              "families_ms_per_step": {k: per(v) for k, v in sorted(fam.items(), key=lambda kv: -kv[1])},
              "regions_ms_per_step": {k.removeprefix("gpu_loop/"): per(v) for k, v in regions.items()},
              "top_kernels": [{"name": k[:160], "ms_per_step": per(v[0]), "calls_per_step": v[1] / steps,
                               "family": v[2]} for k, v in top],
              "processing_s": round(time.time() - t0, 1)}
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    lines = [f"{'ms/step':>9}  {'share':>6}  family"] + [
        f"{v:9.1f}  {v / max(result['ms_per_step_total_kernels'], 1e-9):6.1%}  {k}"
        for k, v in result["families_ms_per_step"].items()]
    lines += ["", "regions (GPU-timeline span of the range): " + json.dumps(result["regions_ms_per_step"]), "",
              f"{'ms/step':>9}  {'calls':>7}  kernel"]
    lines += [f"{t['ms_per_step']:9.1f}  {t['calls_per_step']:7.0f}  {t['name']}" for t in result["top_kernels"]]
    (out / "profile.txt").write_text("\n".join(lines) + "\n")
    log("profile:\n" + "\n".join(lines[:12]))
    return result


def run_profile(args, extra: dict[str, dict]) -> dict:
    """The `profile` subcommand in a subprocess (its own CUDA context and compile), on the variant's config
    (its `--set` overrides included)."""
    name = args.profile_variant
    run_dir = Path(args.work) / f"{name}-profile"
    cfg_path = Path(args.work) / f"{name}-profile.yaml"
    base = base_config(name)
    cfg = run_config(name, args.data, run_dir, 1 + args.profile_steps, args.micro_batch, {**base, **extra.get(name, {})})
    cfg["log"]["detail_every"] = 1000
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, str(Path(__file__).resolve()), "profile", "--config", str(cfg_path), "--out", str(args.out),
           "--steps", str(args.profile_steps)]
    log("profile: " + " ".join(cmd))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.profile_timeout)
    (Path(args.out) / "profile.log").write_text(proc.stdout[-20000:] + proc.stderr[-40000:])
    prof_json = Path(args.out) / "profile.json"
    if proc.returncode != 0 or not prof_json.is_file():
        return {"ok": False, "error": (proc.stderr or proc.stdout)[-2000:]}
    return {"ok": True, "command": " ".join(cmd[1:]), **json.loads(prof_json.read_text())}


def ratios(v: dict) -> dict:
    """Every variant of ours over its peer (BF16 over torchtitan's, FP8 over torchao's blockwise) and
    each FP8 variant over our BF16 at the same micro-batch."""
    def tps(name):
        r = v.get(name) or {}
        return r.get("tokens_per_s") if r.get("ok") else None

    pairs = [("torchao-blockwise-in-titan", "titan-bf16")]
    for name in v:
        if name.startswith("ours-"):
            fp8 = "fp8" in name
            pairs.append((name, "torchao-blockwise-in-titan" if fp8 else "titan-bf16"))
            if fp8:
                pairs.append((name, name.replace("fp8-blockwise", "bf16").replace("fp8", "bf16")))
    return {f"{a} / {b}": tps(a) / tps(b) for a, b in pairs if tps(a) and tps(b)}


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def device_name() -> str:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the shard set (CPU)")
    p.add_argument("--out", default=".gpu_data")
    p.add_argument("--tokens", type=int, default=2_400_000)
    p = sub.add_parser("run", help="measure our variants and the peers")
    p.add_argument("--data", default=".gpu_data/shards")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/gpu_loop")
    p.add_argument("--variants", default=",".join(OURS))
    p.add_argument("--set", action="append", default=[], help="VARIANT:key.sub=value (YAML value) for one variant")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip", type=int, default=2, help="steps left out of the median (compile)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--variant-timeout", type=int, default=240)
    p.add_argument("--peer", default=None, help="a copy of ../shared/bench/peer_torchtitan (omit: no peers)")
    p.add_argument("--peer-variants", default="titan-bf16,titan-fp8-blockwise")
    p.add_argument("--peer-steps", type=int, default=3)
    p.add_argument("--peer-timeout", type=int, default=330)
    p.add_argument("--peer-first", action="store_true")
    p.add_argument("--attention-probe", action="store_true", help="time causal SDPA fwd+bwd first (seconds)")
    p.add_argument("--commit", default=None, help="the commit the working tree was sent at (default: git HEAD)")
    p.add_argument("--profile", action="store_true", help="last: a torch.profiler summary of ours (profile.json/txt)")
    p.add_argument("--profile-variant", default="ours-bf16")
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument("--profile-timeout", type=int, default=200)
    p = sub.add_parser("profile", help="(internal) one run config under torch.profiler")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    if args.command == "prepare":
        print(json.dumps(prepare(Path(args.out), args.tokens), indent=1))
        return
    if args.command == "profile":
        profile_loop(Path(args.config), Path(args.out), args.steps)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra: dict[str, dict] = {}
    for item in args.set:
        name, kv = item.split(":", 1)
        k, v = kv.split("=", 1)
        extra.setdefault(name, {})[k] = yaml.safe_load(v)
    result = {"device": device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": args.commit or git_commit(), "argv": sys.argv, "variants": {}}

    def write():
        result["ratios"] = ratios(result["variants"])
        (out / "gpu_loop.json").write_text(json.dumps(result, indent=1))

    def peers():
        if args.peer:
            try:
                result["variants"].update(run_peer(args))
            except (subprocess.SubprocessError, OSError) as e:
                result["peer_error"] = f"{type(e).__name__}: {e}"[:2000]
            write()

    if args.attention_probe:
        try:
            result["attention_probe"] = attention_probe()
        except Exception as e:  # noqa: BLE001 - a probe, reported
            result["attention_probe"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
        write()
    if args.peer_first:
        peers()
    for name in args.variants.split(","):
        try:
            result["variants"][name] = run_ours(name, args, extra.get(name, {}))
        except (subprocess.SubprocessError, OSError, RuntimeError) as e:
            result["variants"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        write()
    if not args.peer_first:
        peers()
    if args.profile:
        try:
            result["profile"] = run_profile(args, extra)
        except (subprocess.SubprocessError, OSError) as e:
            result["profile"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
    write()
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.3f}")
    for k, v in result["variants"].items():
        print(k, {x: v.get(x) for x in ("ok", "tokens_per_s", "step_ms", "mfu", "peak_mem_gib")})


if __name__ == "__main__":
    main()
