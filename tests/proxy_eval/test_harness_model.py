"""proxy_eval's scorer inside lm-evaluation-harness: `lm_eval --model purokit`.

Three harness tasks read local jsonl files (`dataset_path: json`, no hub): multiple choice
(loglikelihood), word perplexity (loglikelihood_rolling, a text longer than the model's 256-token
window) and generation (generate_until with stop strings and max_gen_toks). They run through
`lm_eval.simple_evaluate` with the model named `purokit` (found through the harness's registry) at
batch sizes 1 and 3, and with the harness's own `hf` model on the same exported weights: per
request, log-likelihoods within 1e-3 nats and equal greedy flags and generations of `hf`, and
bit-identical results across purokit's batch sizes. The `lm_eval` console command is run once as
a user would, on the trainer checkpoint itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lm_eval import simple_evaluate
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager

from proxy_eval.harness import PurokitLM, generation_settings, parse_batch_size

MC_DOCS = [
    {"question": "Which gas do plants take in?", "choices": ["oxygen", "carbon dioxide", "helium"], "answer": 1},
    {"question": "What melts ice?", "choices": ["heat", "cold", "the dark night"], "answer": 0},
    {"question": "Where is Paris?", "choices": ["in France", "in Germany", "on the moon", "at sea"], "answer": 0},
    {"question": "def add(a, b): returns", "choices": [" a + b", " a - b"], "answer": 0},
]
TEXT_DOCS = [
    {"text": "The cat sat on the mat. The dog sat on the log. Water boils at 100 degrees. " * 25},
    {"text": "def add(a, b):\n    return a + b\n"},
    {"text": "Paris is the capital of France."},
]
GEN_DOCS = [
    {"prompt": "Question: What is 2 + 3?\nAnswer:"},
    {"prompt": "The cat sat on"},
    {"prompt": "import math\nprint("},
]
TASKS = ["purokit_mc", "purokit_text", "purokit_gen"]


def task_configs(data: Path) -> dict[str, dict]:
    def source(name: str) -> dict:
        return {"dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data / f"{name}.jsonl")}},
                "test_split": "test"}

    return {
        "purokit_mc": {**source("mc"), "output_type": "multiple_choice",
                       "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "{{choices}}",
                       "doc_to_target": "{{answer}}", "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]},
        "purokit_text": {**source("text"), "output_type": "loglikelihood_rolling", "doc_to_text": "",
                         "doc_to_target": "{{text}}",
                         "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}]},
        "purokit_gen": {**source("gen"), "output_type": "generate_until", "doc_to_text": "{{prompt}}",
                        "doc_to_target": "", "generation_kwargs": {"until": ["\n", "."], "max_gen_toks": 8,
                                                                   "do_sample": False},
                        "metric_list": [{"metric": "bypass"}]},
    }


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    """Task YAMLs for `--include_path`, their data files beside them."""
    d = tmp_path_factory.mktemp("harness-tasks")
    for name, docs in (("mc", MC_DOCS), ("text", TEXT_DOCS), ("gen", GEN_DOCS)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in docs), encoding="utf-8")
    for task, cfg in task_configs(d).items():
        (d / f"{task}.yaml").write_text(yaml.safe_dump({"task": task, **cfg}, sort_keys=False), encoding="utf-8")
    return d


def per_request(out: dict) -> dict[str, list]:
    """task -> each document's responses (doc order), as the harness logs them."""
    return {t: [s["resps"] for s in sorted(out["samples"][t], key=lambda s: s["doc_id"])] for t in TASKS}


@pytest.fixture(scope="module")
def runs(task_dir, exported_model):
    """The three tasks under purokit (batch sizes 1 and 3) and under the harness's `hf` model."""
    manager = TaskManager(include_path=str(task_dir))

    def run(model: str, args: str, batch_size: int) -> dict:
        return simple_evaluate(model=model, model_args=args, tasks=TASKS, task_manager=manager, device="cpu",
                               batch_size=batch_size, log_samples=True, num_fewshot=0)

    return {"purokit_1": run("purokit", f"checkpoint={exported_model}", 1),
            "purokit_3": run("purokit", f"checkpoint={exported_model}", 3),
            "hf": run("hf", f"pretrained={exported_model},dtype=float32", 1)}


def test_purokit_is_found_through_the_harness_registry():
    assert get_model("purokit") is PurokitLM


def test_loglikelihoods_and_generations_equal_the_harness_hf_model(runs):
    ours, theirs = per_request(runs["purokit_1"]), per_request(runs["hf"])
    # multiple choice: one (log-likelihood, is_greedy) per choice
    assert [len(r) for r in ours["purokit_mc"]] == [len(d["choices"]) for d in MC_DOCS]
    for o, h in zip(ours["purokit_mc"], theirs["purokit_mc"]):
        assert [r[0][0] for r in o] == pytest.approx([r[0][0] for r in h], abs=1e-3)
        assert [r[0][1] for r in o] == [r[0][1] for r in h]
    lls = [r[0][0] for r in ours["purokit_mc"][0]]
    assert max(lls) - min(lls) > 0.1            # the choices are told apart
    # rolling: the whole text's log-likelihood, the long one over several windows
    assert [r[0][0] for r in ours["purokit_text"]] == pytest.approx([r[0][0] for r in theirs["purokit_text"]],
                                                                    abs=1e-3)
    # greedy generations, cut at the task's stop strings
    gens = [r[0][0] for r in ours["purokit_gen"]]
    assert gens == [r[0][0] for r in theirs["purokit_gen"]]
    assert any(gens) and not any(("\n" in g or "." in g) for g in gens)
    for metric in ("acc,none", "acc_norm,none"):
        assert runs["purokit_1"]["results"]["purokit_mc"][metric] == runs["hf"]["results"]["purokit_mc"][metric]


def test_results_do_not_move_with_the_batch_size(runs):
    assert per_request(runs["purokit_1"]) == per_request(runs["purokit_3"])
    assert runs["purokit_1"]["results"] == runs["purokit_3"]["results"]


def test_lm_eval_console_command_scores_a_trainer_checkpoint(task_dir, tiny_checkpoint, tokenizer_dir, runs,
                                                              tmp_path):
    """As a user runs it: the `lm_eval` script of this environment, the checkpoint directory and
    its tokenizer as model args. The trainer's own model scores what its HF export scores."""
    lm_eval = Path(sys.executable).parent / "lm_eval"
    cmd = [str(lm_eval), "--model", "purokit",
           "--model_args", f"checkpoint={tiny_checkpoint},tokenizer={tokenizer_dir}",
           "--tasks", "purokit_mc,purokit_text", "--include_path", str(task_dir), "--batch_size", "2",
           "--device", "cpu", "--output_path", str(tmp_path / "out"), "--log_samples"]
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert results["config"]["model"] == "purokit"
    expected = runs["purokit_1"]["results"]
    assert results["results"]["purokit_mc"]["acc,none"] == expected["purokit_mc"]["acc,none"]
    samples = [json.loads(line) for f in (tmp_path / "out").rglob("samples_purokit_mc_*.jsonl")
               for line in f.read_text().splitlines()]
    ours = [[float(r[0][0]) for r in s["resps"]] for s in sorted(samples, key=lambda s: s["doc_id"])]
    assert len(ours) == len(MC_DOCS)
    for o, e in zip(ours, per_request(runs["purokit_1"])["purokit_mc"]):
        assert o == pytest.approx([r[0][0] for r in e], abs=1e-4)
    assert results["results"]["purokit_text"]["word_perplexity,none"] == pytest.approx(
        expected["purokit_text"]["word_perplexity,none"], rel=1e-4)


def test_batch_size_and_generation_settings_read_as_the_harness_writes_them():
    assert parse_batch_size("auto") == parse_batch_size(None) == 8
    assert parse_batch_size("4") == 4
    with pytest.raises(ValueError, match="at least 1"):
        parse_batch_size(0)
    assert generation_settings({"until": "Q:", "max_gen_toks": 5}, "<eos>", 256) == (("Q:", "<eos>"), 5)
    assert generation_settings({"max_new_tokens": 7}, None, 256) == ((), 7)
    assert generation_settings({}, "<eos>", 32) == (("<eos>",), 32)
    with pytest.raises(ValueError, match="greedily"):
        generation_settings({"do_sample": True, "temperature": 0.7}, None, 256)


def test_entry_points_are_registered_beside_the_builtin_models_once():
    """What the .pth hook does to a registry that does not scan plugin groups (lm-eval 0.4.13)."""
    from types import SimpleNamespace

    from lm_eval.api.registry import Registry

    from proxy_eval import lm_eval_plugin

    registry = SimpleNamespace(model_registry=Registry("model"))
    assert lm_eval_plugin.register_entry_points(registry) == ["purokit"]
    assert registry.model_registry.get("purokit") is PurokitLM     # the placeholder resolves to the class
    assert lm_eval_plugin.register_entry_points(registry) == []    # known names are left alone
    scanning = SimpleNamespace(model_registry=Registry("model"), load_plugins=lambda *a: [])
    assert lm_eval_plugin.register_entry_points(scanning) == []    # lm-eval that scans the group itself
    assert "purokit" not in scanning.model_registry


def test_requests_keep_their_order_across_chunks_and_generation_groups(exported_model, monkeypatch):
    """Requests scored in chunks of one batch, and generations of two settings interleaved, come back
    in request order with the scores of one unchunked call."""
    from types import SimpleNamespace

    import proxy_eval.harness as harness

    lm = PurokitLM(checkpoint=str(exported_model), batch_size=2)
    pairs = [(f"Question: {d['question']}\nAnswer:", " " + c) for d in MC_DOCS for c in d["choices"]]
    whole = [(s.logprob, s.is_greedy) for s in lm.scorer.loglikelihood(pairs, batch_size=8)]
    gens = [(d["prompt"], {"until": ["\n"], "max_gen_toks": 4}) for d in GEN_DOCS]
    gens += [(d["prompt"], {"until": ["."], "max_gen_toks": 6}) for d in GEN_DOCS]
    order = [0, 3, 1, 4, 2, 5]
    expected = {}
    for i, (prompt, kw) in enumerate(gens):
        expected[i] = lm.scorer.generate([prompt], kw["max_gen_toks"], stop=tuple(kw["until"]) + ("<|endoftext|>",))[0]
    monkeypatch.setattr(harness, "CHUNK_BATCHES", 1)
    assert lm.loglikelihood([SimpleNamespace(args=p) for p in pairs]) == whole
    assert lm.generate_until([SimpleNamespace(args=gens[i]) for i in order]) == [expected[i] for i in order]
