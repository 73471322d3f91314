"""proxy_eval on a benchmark file whose questions are huge (issue 40: one 10 MB MMLU question took
217 s and ~3.2 GB for 2 documents): wall time and peak memory of loading and scoring the task,
with the scorer as it is (a context is tokenized from the tail the model's window sees) beside
the same scorer tokenizing every context whole (what it did before), in the same run.

    .venv/bin/python benchmarks/long_question.py [--mb 10] [--docs 2]

Each variant runs in its own process (peak RSS is per process). The model is a random tiny
Qwen3ForCausalLM (2 layers × 32, window 512) and a byte-level BPE trained here, as in the tests:
the cost measured is the input handling, not the model. MMLU preset: one form (cloze over the
letters), 4 choices, so 4 requests per document.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _scorer(whole: bool):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from proxy_eval.models import HFTokenizer, TorchModuleScorer
    from tests.proxy_eval.conftest import CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         max_position_embeddings=512)).eval()

    class Whole(TorchModuleScorer):
        def _tail(self, text, keep):           # the scorer before issue 40: every context tokenized whole
            return text

    cls = Whole if whole else TorchModuleScorer
    return cls(model, HFTokenizer(tok, eos_token="<|endoftext|>"), 512, forward=lambda m, ids: m(input_ids=ids).logits)


def run_variant(path: str, whole: bool) -> dict:
    from proxy_eval.evaluate import evaluate_task
    from proxy_eval.tasks import DataSource, TaskConfig, load_task

    scorer = _scorer(whole)
    t0 = time.perf_counter()
    task = load_task(TaskConfig(name="mmlu", format="multiple_choice", preset="mmlu", source=DataSource(path=path)))
    result = evaluate_task(scorer, task)
    return {"seconds": round(time.perf_counter() - t0, 2), "peak_rss_mib": round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "score": result.value, "n": result.n,
        "loglikelihoods": [s["cloze"]["loglikelihoods"] for s in result.samples]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--variant", choices=["tail", "whole"], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.data, args.variant == "whole")))
        return
    from benchmarks._results import save

    work = Path(__file__).resolve().parent / "_work"
    work.mkdir(exist_ok=True)
    data = work / "long_question.jsonl"
    n = int(args.mb * 1_000_000)
    text = ("The cat sat on the mat. Paris is the capital of France. " * (n // 56 + 1))[:n]
    with open(data, "w") as fh:
        for i in range(args.docs):
            fh.write(json.dumps({"question": f"{i} {text}", "choices": ["4", "5", "6", "7"], "answer": 1}) + "\n")
    out = {"command": " ".join(sys.argv), "question_mb": args.mb, "docs": args.docs,
           "load_average": os.getloadavg()[0]}
    for variant in ("tail", "whole"):
        proc = subprocess.run([sys.executable, __file__, "--variant", variant, "--data", str(data)],
                              capture_output=True, text=True, check=True)
        out[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["speedup"] = round(out["whole"]["seconds"] / max(out["tail"]["seconds"], 1e-9), 1)
    out["same_loglikelihoods"] = out["whole"]["loglikelihoods"] == out["tail"]["loglikelihoods"]
    save("long_question", out)


if __name__ == "__main__":
    main()
