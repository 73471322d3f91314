"""proxy_eval benchmark: sandbox verdict latency and scoring throughput, each beside its anchor.

    .venv/bin/python benchmarks/proxy_eval_bench.py [--quick]

1. Sandbox (purokit/sandbox.py): mean latency of one verdict on trivial code (interpreter start,
   rlimits, audit-hook prelude, `unshare -n`, temp dir) against a bare `python -I -c pass`
   subprocess, sequentially, in the same run; and verdicts/s with 2 workers.
2. Scoring (proxy_eval/models.py): multiple-choice log-likelihood requests/s of the batched scorer
   at batch sizes 8 and 32 against batch size 1 (what a per-request loop does), on the same model
   and requests; plus bits-per-byte tokens/s. The model is the trainer's Transformer (random
   weights, 4 layers × 256 wide, 8k vocabulary), fp32 on CPU with 1 thread.
Timings on a shared machine are noisy: the ratios are what to read; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bench_sandbox(n: int) -> dict:
    from purokit.sandbox import SandboxJob, SandboxLimits, network_namespace_prefix, run_many, run_python

    limits = SandboxLimits(timeout_s=10, memory_mb=512)
    run_python("pass", limits=limits)                            # warm caches
    t0 = time.perf_counter()
    for _ in range(n):
        v = run_python("def f(x):\n    return x + 1\n", tests="assert f(1) == 2", limits=limits)
        assert v.passed, v
    sandbox_s = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
    bare_s = (time.perf_counter() - t0) / n
    jobs = [SandboxJob(code="x = 1", tests="assert x == 1", limits=limits) for _ in range(n)]
    t0 = time.perf_counter()
    verdicts = run_many(jobs, max_workers=2)
    par_rate = n / (time.perf_counter() - t0)
    assert all(v.passed for v in verdicts)
    return {"verdict_latency_ms": round(1000 * sandbox_s, 1), "bare_python_ms": round(1000 * bare_s, 1),
            "ratio_sandbox_to_bare": round(sandbox_s / bare_s, 2), "verdicts_per_s_2_workers": round(par_rate, 1),
            "network_namespace": bool(network_namespace_prefix()), "n": n}


def bench_scoring(n_items: int) -> dict:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from proxy_eval.models import HFTokenizer, TorchModuleScorer
    from trainer.model import build_model, preset_config

    torch.set_num_threads(1)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    corpus = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                                                        show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = HFTokenizer(tok, eos_token="<|endoftext|>")
    cfg = preset_config("tiny", vocab_size=tok.get_vocab_size(), d_model=256, n_layers=4, n_heads=4, n_kv_heads=2,
                        head_dim=64, d_ff=768, max_seq_len=512)
    model = build_model(cfg, seed=0)
    scorer = TorchModuleScorer(model, tokenizer, max_length=512)
    requests = []
    for _ in range(n_items):
        ctx = "Question: " + " ".join(rng.choice(words) for _ in range(rng.randint(40, 90))) + "\nAnswer:"
        for _ in range(4):
            requests.append((ctx, " " + " ".join(rng.choice(words) for _ in range(rng.randint(2, 8)))))
    out = {"requests": len(requests), "params": sum(p.numel() for p in model.parameters())}
    ref = None
    for bs in (1, 8, 32):
        t0 = time.perf_counter()
        scores = scorer.loglikelihood(requests, batch_size=bs)
        dt = time.perf_counter() - t0
        out[f"mc_requests_per_s_bs{bs}"] = round(len(requests) / dt, 1)
        lp = [s.logprob for s in scores]
        if ref is None:
            ref = lp
        out[f"max_abs_logprob_diff_bs{bs}_vs_bs1"] = float(max(abs(a - b) for a, b in zip(lp, ref)))
    out["speedup_bs32_vs_bs1"] = round(out["mc_requests_per_s_bs32"] / out["mc_requests_per_s_bs1"], 2)
    texts = corpus[:n_items]
    t0 = time.perf_counter()
    res = scorer.loglikelihood_rolling(texts, batch_size=16)
    out["bpb_tokens_per_s_bs16"] = round(sum(r.n_tokens for r in res) / (time.perf_counter() - t0), 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()
    result = {"machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before]},
              "sandbox": bench_sandbox(10 if args.quick else 30),
              "scoring": bench_scoring(40 if args.quick else 150)}
    result["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
