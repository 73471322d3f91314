"""Task formats scored on hand-checked examples, loading from every source kind, and batch-size
invariance with a real (tiny) model."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from purokit.errors import ContractError
from proxy_eval.evaluate import evaluate_suite, evaluate_task
from proxy_eval.models import ContinuationScore, HFCausalLMScorer, TextScore, TorchModuleScorer
from proxy_eval.tasks import DataSource, SuiteConfig, TaskConfig, load_task, mc_requests, read_records


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


class TableModel:
    """A test double with known answers: log-likelihoods by continuation, generations by prompt end."""

    name = "table"

    def __init__(self, lls=None, generations=None):
        self.lls = lls or {}
        self.generations = generations or {}

    def loglikelihood(self, requests, batch_size=8):
        return [ContinuationScore(self.lls[(ctx.splitlines()[-1] if "\n" in ctx else ctx, cont)], 1, False)
                for ctx, cont in requests]

    def loglikelihood_rolling(self, texts, batch_size=8):
        return [TextScore(len(t) * math.log(2), len(t)) for t in texts]

    def generate(self, prompts, max_new_tokens, stop=(), batch_size=8):
        return [next(v for k, v in self.generations.items() if p.rstrip().endswith(k)) for p in prompts]


def test_multiple_choice_hand_checked_olmes(tmp_path):
    src = write_jsonl(tmp_path / "mc.jsonl", [
        {"query": "Q1", "choices": ["yes", "no"], "gold": 0},
        {"query": "Q2", "choices": ["red", "green blue"], "gold": "B"},
    ])
    task = load_task(TaskConfig(name="mc", format="multiple_choice", source=DataSource(path=str(src))))
    # prompts end with "Answer:" for both forms: key on the continuation per doc via the query text
    lls = {}
    cloze = {("Answer:", " yes"): -1.0, ("Answer:", " no"): -2.0}
    # Q1 cloze: acc 1 (yes); Q2 cloze: " red" -3.0 (4 bytes), " green blue" -4.0 (11 bytes):
    #   acc picks red (wrong), acc_norm picks green blue (right)
    # letters: Q1 " A" -0.5 / " B" -0.1 (wrong), Q2 " A" -0.2 / " B" -0.3 (wrong)
    seq = iter([-1.0, -2.0, -3.0, -4.0, -0.5, -0.1, -0.2, -0.3])

    class SeqModel(TableModel):
        def loglikelihood(self, requests, batch_size=8):
            return [ContinuationScore(next(seq), 1, False) for _ in requests]

    r = evaluate_task(SeqModel(lls), task)
    assert r.metrics["cloze.acc"].value == 0.5
    assert r.metrics["cloze.acc_norm"].value == 1.0
    assert r.metrics["letters.acc"].value == 0.0
    assert r.detail["olmes_form"] == "cloze" and r.value == 1.0
    p1 = math.exp(-1) / (math.exp(-1) + math.exp(-2))
    p2 = math.exp(-4) / (math.exp(-3) + math.exp(-4))
    assert r.metrics["cloze.prob_correct"].value == pytest.approx((p1 + p2) / 2)
    assert r.samples[1]["gold"] == 1
    del cloze


def test_mc_prompts_cloze_and_letters_with_fewshot(tmp_path):
    src = write_jsonl(tmp_path / "mc.jsonl", [
        {"query": f"Q{i}", "choices": ["a", "b", "c"], "gold": i % 3} for i in range(5)])
    task = load_task(TaskConfig(name="mc", format="multiple_choice", source=DataSource(path=str(src)), num_fewshot=2))
    assert len(task.fewshot) == 2 and len(task.docs) == 3
    assert {d["doc_id"] for d in task.fewshot}.isdisjoint({d["doc_id"] for d in task.docs})
    cloze = mc_requests(task, task.docs[0], "cloze")
    letters = mc_requests(task, task.docs[0], "letters")
    shot = task.fewshot[0]
    assert cloze[0][0].startswith(f"Question: {shot['query']}\nAnswer: {shot['choices'][shot['gold']]}\n\n")
    assert cloze[0][0].endswith(f"Question: {task.docs[0]['query']}\nAnswer:")
    assert [c for _, c in cloze] == [" a", " b", " c"]
    assert letters[0][0].endswith(" A. a\n B. b\n C. c\nAnswer:")
    assert [c for _, c in letters] == [" A", " B", " C"]
    # the same seed gives the same few-shot examples
    again = load_task(TaskConfig(name="mc", format="multiple_choice", source=DataSource(path=str(src)), num_fewshot=2))
    assert [d["doc_id"] for d in again.fewshot] == [d["doc_id"] for d in task.fewshot]


def test_generate_exact_match_gsm8k_style(tmp_path):
    src = write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "A?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
        {"question": "B?", "answer": "#### 1,000"},
        {"question": "C?", "answer": "#### -3"},
        {"question": "D?", "answer": "#### 0.5"},
    ])
    task = load_task(TaskConfig(name="gsm", format="generate", preset="gsm8k", source=DataSource(path=str(src))))
    model = TableModel(generations={
        "A?\nAnswer:": " 2 plus 2 is 4.\n#### 4",
        "B?\nAnswer:": " The answer is $1,000.",
        "C?\nAnswer:": " It is 3 below zero, so \\boxed{3}",      # sign lost: wrong
        "D?\nAnswer:": " Half, i.e. \\boxed{\\frac{1}{2}}",
    })
    r = evaluate_task(model, task)
    assert [s["match"] for s in r.samples] == [True, True, False, True]
    assert r.value == 0.75 and r.metric == "exact_match"
    assert r.stderr == pytest.approx(math.sqrt(4 / 3 * 0.75 * 0.25) / math.sqrt(4))   # sample std (ddof=1) / sqrt(n)


def test_code_pass_at_1_in_sandbox(tmp_path):
    src = write_jsonl(tmp_path / "he.jsonl", [
        {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"},
        {"prompt": "def sub(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == -1\n", "entry_point": "sub"},
        {"prompt": "def spin(a, b):\n", "test": "def check(f):\n    assert f(1, 1) == 0\n", "entry_point": "spin"},
    ])
    task = load_task(TaskConfig(name="he", format="code", preset="humaneval", source=DataSource(path=str(src)),
                                timeout_s=2, memory_mb=256))
    model = TableModel(generations={
        "def add(a, b):": "    return a + b\n",
        "def sub(a, b):": "    return b - a\n",
        "def spin(a, b):": "    while True:\n        pass\n",
    })
    r = evaluate_task(model, task)
    assert r.value == pytest.approx(1 / 3) and r.metric == "pass@1"
    assert [s["status"] for s in r.samples] == ["passed", "failed", "timeout"]
    assert r.detail["statuses"] == {"passed": 1, "failed": 1, "timeout": 1}


class UniformLM(torch.nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, ids):
        return torch.zeros(*ids.shape, self.vocab)


def test_bits_per_byte_of_a_uniform_model_is_hand_computable(tmp_path, tokenizer):
    texts = ["The cat sat on the mat.", "def add(a, b):\n    return a + b\n" * 30]
    src = write_jsonl(tmp_path / "t.jsonl", [{"text": t} for t in texts])
    task = load_task(TaskConfig(name="bpb", format="bits_per_byte", preset="text", source=DataSource(path=str(src))))
    V = tokenizer.vocab_size
    model = TorchModuleScorer(UniformLM(V), tokenizer, max_length=64)   # forces several windows
    r = evaluate_task(model, task)
    n_tok = sum(len(tokenizer.encode(t)) for t in texts)
    n_bytes = sum(len(t.encode()) for t in texts)
    assert r.value == pytest.approx(n_tok * math.log(V) / math.log(2) / n_bytes, rel=1e-6)
    assert r.higher_is_better is False
    assert r.metrics["nll_per_token"].value == pytest.approx(math.log(V), rel=1e-6)


def test_sources_jsonl_parquet_and_datasets_disk_agree(tmp_path):
    import datasets

    recs = [{"question": "Which?", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "B"},
            {"question": "Other?", "choices": {"text": ["p", "q", "r"], "label": ["1", "2", "3"]}, "answerKey": "3"}]
    j = write_jsonl(tmp_path / "arc.jsonl", recs)
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "arc.parquet")
    datasets.DatasetDict({"test": datasets.Dataset.from_list(recs)}).save_to_disk(str(tmp_path / "arc_ds"))
    docs = []
    for src in (DataSource(path=str(j)), DataSource(path=str(tmp_path / "arc.parquet")),
                DataSource(path=str(tmp_path / "arc_ds"), split="test")):
        t = load_task(TaskConfig(name="arc", format="multiple_choice", preset="arc", source=src))
        docs.append([(d["query"], d["choices"], d["gold"]) for d in t.docs])
    assert docs[0] == docs[1] == docs[2] == [("Which?", ["x", "y"], 1), ("Other?", ["p", "q", "r"], 2)]
    with pytest.raises(ContractError, match="split"):
        read_records(DataSource(path=str(tmp_path / "arc_ds")))


def test_bad_records_fail_naming_file_and_record(tmp_path):
    src = write_jsonl(tmp_path / "bad.jsonl", [{"query": "q", "choices": ["a"], "gold": 3}])
    with pytest.raises(ContractError, match=r"bad.jsonl record 0"):
        load_task(TaskConfig(name="b", format="multiple_choice", source=DataSource(path=str(src))))
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{nope\n')
    with pytest.raises(ContractError, match=r"broken.jsonl:2"):
        read_records(DataSource(path=str(tmp_path / "broken.jsonl")))
    with pytest.raises(ValueError, match="preset"):
        TaskConfig(name="x", format="generate", preset="arc", source=DataSource(path="x.jsonl"))


def test_presets_mbpp_hellaswag_math(tmp_path):
    mbpp = write_jsonl(tmp_path / "mbpp.jsonl", [{"text": "Write add.", "test_list": ["assert add(1, 2) == 3"],
                                                   "code": "def add(a, b):\n    return a + b"}])
    t = load_task(TaskConfig(name="mbpp", format="code", preset="mbpp", source=DataSource(path=str(mbpp))))
    assert "assert add(1, 2) == 3" in t.docs[0]["prompt"] and t.docs[0]["prompt"].endswith("[BEGIN]\n")
    model = TableModel(generations={"[BEGIN]": "def add(a, b):\n    return a + b\n[DONE]"})
    assert evaluate_task(model, t).value == 1.0
    hs = write_jsonl(tmp_path / "hs.jsonl", [{"ctx_a": "A man walks", "ctx_b": "then he", "endings": ["sits", "flies"],
                                              "label": "0"}])
    t = load_task(TaskConfig(name="hs", format="multiple_choice", preset="hellaswag", source=DataSource(path=str(hs))))
    assert t.docs[0]["query"] == "A man walks Then he" and t.docs[0]["gold"] == 0
    m = write_jsonl(tmp_path / "math.jsonl", [{"problem": "1/2+1/4?", "solution": "We get $\\boxed{\\frac{3}{4}}$."}])
    t = load_task(TaskConfig(name="math", format="generate", preset="math", source=DataSource(path=str(m))))
    assert t.docs[0]["answer"] == "\\frac{3}{4}"


def _suite(tmp_path):
    mc = write_jsonl(tmp_path / "mc.jsonl", [
        {"query": f"What is {i} plus {i}?", "choices": [str(2 * i), str(2 * i + 1), "cat", "the mat"], "gold": 0}
        for i in range(7)])
    gen = write_jsonl(tmp_path / "gen.jsonl", [{"question": f"What is {i} + 3?", "answer": str(i + 3)} for i in range(5)])
    txt = write_jsonl(tmp_path / "txt.jsonl", [{"text": "The dog sat on the log. " * (1 + i)} for i in range(6)])
    return SuiteConfig(tasks=[
        TaskConfig(name="mc", format="multiple_choice", source=DataSource(path=str(mc)), num_fewshot=1),
        TaskConfig(name="gen", format="generate", source=DataSource(path=str(gen)), max_new_tokens=6),
        TaskConfig(name="txt", format="bits_per_byte", preset="text", group="Prose", source=DataSource(path=str(txt))),
    ], groups={"mc": "Math"})


def test_batch_size_does_not_change_results(tmp_path, tokenizer, tiny_qwen):
    """The lm-evaluation-harness bug (results change with batch size) must not exist here."""
    suite = _suite(tmp_path)
    model = HFCausalLMScorer(tiny_qwen, tokenizer, max_length=48)   # small window: exercises truncation too
    runs = {bs: evaluate_suite(model, suite, batch_size=bs) for bs in (1, 3, 16)}
    base = runs[1]
    assert [r.group for r in base.results] == ["Math", "General", "Prose"]
    for bs, other in runs.items():
        for a, b in zip(base.results, other.results):
            assert a.value == pytest.approx(b.value, abs=1e-6), (bs, a.task)
            if a.format == "multiple_choice":
                for sa, sb in zip(a.samples, b.samples):
                    assert sa["cloze"]["loglikelihoods"] == pytest.approx(sb["cloze"]["loglikelihoods"], abs=1e-5)
                    assert sa["cloze"]["acc"] == sb["cloze"]["acc"] and sa["letters"]["acc"] == sb["letters"]["acc"]
            if a.format == "generate":
                assert [s["generation"] for s in a.samples] == [s["generation"] for s in b.samples]


def test_module_and_hf_adapters_agree_on_the_same_weights(tmp_path, tokenizer, tiny_qwen):
    suite = _suite(tmp_path)
    hf = HFCausalLMScorer(tiny_qwen, tokenizer, max_length=128)
    mod = TorchModuleScorer(tiny_qwen, tokenizer, max_length=128, forward=lambda m, ids: m(input_ids=ids).logits)
    a, b = evaluate_suite(hf, suite), evaluate_suite(mod, suite)
    assert [r.value for r in a.results] == pytest.approx([r.value for r in b.results], abs=1e-9)


def test_loglikelihood_matches_a_manual_forward(tokenizer, tiny_qwen):
    """Default (lm-eval): the context as the tokenizer encodes it, no prefix token; with
    prefix_contexts (OLMES / shard convention): the end-of-text token first."""
    ctx, cont = "The cat sat on", " the mat"
    for prefix_contexts in (False, True):
        model = HFCausalLMScorer(tiny_qwen, tokenizer, max_length=128, prefix_contexts=prefix_contexts)
        [score] = model.loglikelihood([(ctx, cont)])
        ids = [model.prefix_token_id] * prefix_contexts + tokenizer.encode(ctx + cont)
        n_cont = len(ids) - prefix_contexts - len(tokenizer.encode(ctx))
        with torch.no_grad():
            logp = torch.log_softmax(tiny_qwen(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        manual = sum(float(logp[i - 1, ids[i]]) for i in range(len(ids) - n_cont, len(ids)))
        assert score.n_tokens == n_cont and score.logprob == pytest.approx(manual, abs=1e-5)


def test_results_files_are_byte_identical_across_runs(tmp_path, tokenizer, tiny_qwen):
    suite = _suite(tmp_path)
    model = HFCausalLMScorer(tiny_qwen, tokenizer, max_length=64)
    evaluate_suite(model, suite).write(tmp_path / "a")
    evaluate_suite(model, suite, batch_size=5).write(tmp_path / "b")
    for rel in ("results.json", "samples/gen.jsonl", "samples/txt.jsonl"):
        a, b = (tmp_path / "a" / rel).read_bytes(), (tmp_path / "b" / rel).read_bytes()
        if rel == "results.json":   # the batch size is recorded; everything else must match
            a, b = a.replace(b'"batch_size": 8', b'"batch_size": 5'), b
        assert a == b, rel
