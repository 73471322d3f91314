"""Every lm-evaluation-harness preset scores like lm_eval itself.

One tiny model (a trainer checkpoint exported to Hugging Face format) is scored by lm_eval 0.4
(its HFLM on the exported directory, its own task YAMLs read from the installed package with the
dataset pointed at local files in the public layouts) and by proxy_eval (the same directory through
`open_scorer`, the matching preset). Per item: log-likelihoods within 1e-3 nats and equal acc /
acc_norm (multiple choice), equal generations and exact match (generative), equal rolling NLL
(bits per byte). Zero-shot by default: proxy_eval's few-shot examples are a seeded sample, the
harness's a per-task sampler; MMLU is also compared 2-shot with both taking the first dev examples
(`fewshot_sampler: first_n`, the harness's sampler for MMLU/CMMLU/C-Eval).

What differs on purpose and is not compared: the OLMES best-of-forms score (proxy_eval's primary
multiple-choice metric; the harness reports acc and acc_norm of its one prompt), GSM8K/MATH answer
extraction (Puro's postprocessor, proxy_eval.extract, instead of the harness's regexes), and
pass@1 of HumanEval/MBPP (the harness loads `code_eval` from the hub; the generations are compared).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import datasets
import lm_eval
import pytest
from lm_eval.api.task import ConfigurableTask
from lm_eval.evaluator import evaluate as lm_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks._yaml_loader import load_yaml

from proxy_eval.evaluate import evaluate_task
from proxy_eval.loading import open_scorer
from proxy_eval.tasks import DataSource, TaskConfig, load_task

TASKS = Path(lm_eval.__file__).parent / "tasks"
GEN_TOKENS = 6

# small items in each dataset's public layout (field names and label conventions as published)
FIXTURES: dict[str, list[dict]] = {
    "arc": [
        {"id": "Mercury_1", "question": "Which gas do plants take in?", "answerKey": "B",
         "choices": {"text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]}},
        {"id": "NYSED_2", "question": "What melts ice?", "answerKey": "1",
         "choices": {"text": ["heat", "cold", "dark"], "label": ["1", "2", "3"]}},
    ],
    "hellaswag": [
        {"ind": 4, "activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow.",
         "ctx_b": "then", "ctx": "", "endings": ["he sits [title] down.", "the man is done.", "a cat [step] runs.",
                                                 "water boils."], "label": "1", "split": "val", "split_type": "indomain",
         "source_id": "activitynet~v_1"},
        {"ind": 9, "activity_label": "Baking cookies", "ctx_a": "A woman mixes flour.", "ctx_b": "she",
         "ctx": "", "endings": ["adds eggs.", "sleeps.", "paints  the wall.", "runs [header] away."], "label": "0",
         "split": "val", "split_type": "indomain", "source_id": "wikihow~2"},
    ],
    "piqa": [
        {"goal": "How do I boil water?", "sol1": "Heat it in a pot.", "sol2": "Put it in the freezer.", "label": 0},
        {"goal": "Open a jar", "sol1": "Paint the lid.", "sol2": "Twist the lid.", "label": 1},
    ],
    "siqa": [
        {"context": "Tracy fed the cat.", "question": "How would the cat feel?", "answerA": "hungry",
         "answerB": "full", "answerC": "angry", "label": "2"},
        {"context": "Sam lost the game.", "question": "What will Sam want to do?", "answerA": "play again",
         "answerB": "eat a mat", "answerC": "sleep", "label": "1"},
    ],
    "winogrande": [
        {"sentence": "The cat sat on the mat because _ was tired.", "option1": "the cat", "option2": "the mat",
         "answer": "1"},
        {"sentence": "Water boils before ice because _ is hot.", "option1": "ice", "option2": "water", "answer": "2"},
    ],
    "boolq": [
        {"question": "is paris the capital of france", "passage": "Paris is the capital of France.", "idx": 0,
         "label": 1},
        {"question": "does ice melt at 50 degrees", "passage": "Ice melts at 0 degrees.", "idx": 1, "label": 0},
    ],
    "mmlu": [
        {"question": "What is 2 + 3? ", "subject": "anatomy", "choices": ["4", "5", "6", "7"], "answer": 1},
        {"question": "Which is a bone?", "subject": "anatomy", "choices": ["femur", "liver", "lung", "skin"],
         "answer": 0},
    ],
    "cmmlu": [
        {"Question": "水在多少度沸腾？", "A": "50", "B": "100", "C": "0", "D": "10", "Answer": "B"},
        {"Question": "法国的首都是？", "A": "柏林", "B": "罗马", "C": "巴黎", "D": "马德里", "Answer": "C"},
    ],
    "ceval": [
        {"id": 0, "question": "冰在多少度融化？", "A": "0", "B": "100", "C": "50", "D": "10", "answer": "A",
         "explanation": ""},
    ],
    "mmlu_pro": [
        {"question_id": 1, "question": "What is the capital of France?", "options": ["Berlin", "Paris", "Rome"],
         "answer": "B", "answer_index": 1, "cot_content": "", "category": "law", "src": "ori_mmlu-law"},
        {"question_id": 2, "question": "Which is a law?", "options": ["gravity", "tax", "cat", "mat"],
         "answer": "B", "answer_index": 1, "cot_content": "", "category": "law", "src": "ori_mmlu-law"},
    ],
    "bbh": [
        {"input": "not ( True ) and ( True ) is", "target": "False"},
        {"input": "True and not False is", "target": "True"},
    ],
    "gsm8k": [
        {"question": "Tom has 2 apples and buys 3 more. How many apples does he have?",
         "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
    ],
    "math": [
        {"problem": "What is $1+1$?", "level": "Level 1", "type": "Algebra",
         "solution": "We have $1+1=\\boxed{2}$."},
    ],
    "humaneval": [
        {"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n",
         "canonical_solution": "    return a + b\n", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
         "entry_point": "add"},
    ],
    "mbpp": [
        {"task_id": 11, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n  return a + b",
         "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(2, 2) == 4"],
         "test_setup_code": "", "challenge_test_list": []},
    ],
    "text": [
        {"text": "The cat sat on the mat. The dog sat on the log. Water boils at 100 degrees. " * 30},
        {"text": "def add(a, b):\n    return a + b\n"},
    ],
}

# preset -> (lm-eval task YAML, format, proxy_eval TaskConfig extras, harness config overrides)
ZH_AGRONOMY = "以下是关于农学的单项选择题，请直接给出正确答案的选项。\n\n"
ZH_LAW = "以下是中国关于法学的单项选择题，请选出其中的正确答案。\n\n"
BBH_DESC = "Evaluate the result of a random Boolean expression.\n\n"
CASES = {
    "arc": ("arc/arc_easy.yaml", "multiple_choice", {}),
    "arc_challenge": ("arc/arc_challenge.yaml", "multiple_choice", {}),
    "hellaswag": ("hellaswag/hellaswag.yaml", "multiple_choice", {}),
    "piqa": ("piqa/piqa.yaml", "multiple_choice", {}),
    "siqa": ("siqa/siqa.yaml", "multiple_choice", {}),
    "winogrande": ("winogrande/default.yaml", "multiple_choice", {}),
    "boolq": ("super_glue/boolq/default.yaml", "multiple_choice", {}),
    "mmlu": ("mmlu/default/mmlu_anatomy.yaml", "multiple_choice", {}),
    "mmlu_continuation": ("mmlu/continuation/mmlu_anatomy.yaml", "multiple_choice", {}),
    "cmmlu": ("cmmlu/cmmlu_agronomy.yaml", "multiple_choice", {"description": ZH_AGRONOMY}),
    "ceval": ("ceval/ceval-valid_law.yaml", "multiple_choice", {"description": ZH_LAW}),
    "mmlu_pro": ("mmlu_pro/mmlu_pro_law.yaml", "generate", {}),
    "bbh": ("bbh/zeroshot/boolean_expressions.yaml", "generate", {"description": BBH_DESC}),
    "gsm8k": ("gsm8k/gsm8k.yaml", "generate", {}),
    "math": ("hendrycks_math/hendrycks_math_algebra.yaml", "generate", {}),
    "humaneval": ("humaneval/humaneval.yaml", "code", {}),
    "mbpp": ("mbpp/mbpp.yaml", "code", {}),
    "text": (None, "bits_per_byte", {}),
    # few-shot from the dev split, first examples in order (the harness's `first_n` sampler)
    "mmlu_2shot": ("mmlu/default/mmlu_anatomy.yaml", "multiple_choice", {}),
    # proxy_eval reading a `datasets.save_to_disk` directory (the harness reads the same records as json)
    "boolq_disk": ("super_glue/boolq/default.yaml", "multiple_choice", {}),
    "mmlu_continuation_2shot": ("mmlu/continuation/mmlu_anatomy.yaml", "multiple_choice", {}),
}
FIXTURE_OF = {"arc_challenge": "arc", "mmlu_continuation": "mmlu", "mmlu_2shot": "mmlu",
              "mmlu_continuation_2shot": "mmlu", "boolq_disk": "boolq"}
PRESET_OF = {"arc_challenge": "arc", "mmlu_2shot": "mmlu", "mmlu_continuation_2shot": "mmlu_continuation",
             "boolq_disk": "boolq"}
FEWSHOT = {"mmlu_2shot": 2, "mmlu_continuation_2shot": 2}
MMLU_DEV = [
    {"question": "Which organ pumps blood?", "subject": "anatomy", "choices": ["heart", "lung", "skin", "eye"],
     "answer": 0},
    {"question": "How many legs has a cat?", "subject": "anatomy", "choices": ["2", "3", "4", "5"], "answer": 2},
    {"question": "Which is not a bone?", "subject": "anatomy", "choices": ["tibia", "ulna", "liver", "femur"],
     "answer": 2},
]


def harness_config(name: str, data: Path, dev: Path) -> dict:
    yaml_path, fmt, _ = CASES[name]
    if yaml_path is None:      # bits per byte: a rolling log-likelihood task over the text
        cfg = {"task": "text_bpb", "output_type": "loglikelihood_rolling", "doc_to_text": "",
               "doc_to_target": "{{text}}", "metric_list": [{"metric": "bits_per_byte"}]}
    else:
        # code tasks' utils load `code_eval` from the hub at import: keep their prompts, drop the metric
        cfg = load_yaml(TASKS / yaml_path, resolve_func=(fmt != "code"))
    cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": {"test": str(data)}},
               test_split="test", validation_split=None, training_split=None, fewshot_split=None, num_fewshot=0)
    if name in FEWSHOT:
        cfg.update(dataset_kwargs={"data_files": {"test": str(data), "dev": str(dev)}}, fewshot_split="dev",
                   num_fewshot=FEWSHOT[name])
        assert cfg["fewshot_config"]["sampler"] == "first_n"
    else:
        cfg.pop("fewshot_config", None)
    if fmt in ("generate", "code"):
        cfg["generation_kwargs"] = {**cfg.get("generation_kwargs", {}), "max_gen_toks": GEN_TOKENS,
                                    "do_sample": False}
        cfg["generation_kwargs"].pop("temperature", None)
    if fmt == "code":
        cfg["metric_list"] = [{"metric": "bypass"}]
        cfg["unsafe_code"] = False      # nothing is executed on the harness side
        cfg.pop("filter_list", None)
    if name == "mbpp":
        cfg["doc_to_target"] = "{{test_list[0]}}"
    return cfg


@pytest.fixture(scope="module")
def both(exported_model, tmp_path_factory):
    """Every case scored by lm_eval (one evaluate call, one model load) and by proxy_eval."""
    data_dir = tmp_path_factory.mktemp("layouts")
    files = {}
    for name, recs in FIXTURES.items():
        files[name] = data_dir / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    dev = data_dir / "mmlu_dev.jsonl"
    dev.write_text("".join(json.dumps(r) + "\n" for r in MMLU_DEV), encoding="utf-8")
    tasks = {name: ConfigurableTask(config=harness_config(name, files[FIXTURE_OF.get(name, name)], dev))
             for name in CASES}
    lm = HFLM(pretrained=str(exported_model), device="cpu", batch_size=1, dtype="float32")
    t0 = time.perf_counter()
    out = lm_evaluate(lm=lm, task_dict=tasks, log_samples=True)
    print(f"lm_eval: {time.perf_counter() - t0:.1f}s")
    harness = {}
    for name in CASES:   # one sample per document (tasks with several filters log one per filter)
        first = {}
        for s in out["samples"][name]:
            first.setdefault(s["doc_id"], s)
        harness[name] = [first[i] for i in sorted(first)]
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(FIXTURES["boolq"])}).save_to_disk(
        str(data_dir / "boolq_disk"))
    scorer = open_scorer(exported_model)
    ours = {}
    for name, (_, fmt, extra) in CASES.items():
        if name in FEWSHOT:
            extra = {**extra, "num_fewshot": FEWSHOT[name], "fewshot_source": DataSource(path=str(dev)),
                     "fewshot_sampler": "first_n"}
        source = (DataSource(path=str(data_dir / "boolq_disk"), split="validation") if name == "boolq_disk"
                  else DataSource(path=str(files[FIXTURE_OF.get(name, name)])))
        cfg = TaskConfig(name=name, format=fmt, preset=PRESET_OF.get(name, name), source=source,
                         max_new_tokens=GEN_TOKENS, **extra)
        ours[name] = evaluate_task(scorer, load_task(cfg), batch_size=4)
    return harness, ours


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[1] == "multiple_choice"])
def test_multiple_choice_loglikelihoods_and_accuracies_equal_lm_eval(both, name):
    harness, ours = both
    h, o = harness[name], ours[name].samples
    assert len(h) == len(o) == len(FIXTURES[FIXTURE_OF.get(name, name)])
    for hs, os_ in zip(h, o):
        if name in FEWSHOT:        # the shots are in the harness's context (and ours scores the same)
            assert all(d["question"] in hs["arguments"][0][0] for d in MMLU_DEV[:FEWSHOT[name]])
            assert MMLU_DEV[FEWSHOT[name]]["question"] not in hs["arguments"][0][0]
        h_lls = [r[0][0] for r in hs["resps"]]
        assert os_["cloze"]["loglikelihoods"] == pytest.approx(h_lls, abs=1e-3), (name, hs["doc_id"])
        assert os_["cloze"]["acc"] == hs["acc"], (name, hs["doc_id"])
        if "acc_norm" in hs:
            assert os_["cloze"]["acc_norm"] == hs["acc_norm"], (name, hs["doc_id"])
    # the items are not degenerate: choices get clearly different log-likelihoods
    lls = o[0]["cloze"]["loglikelihoods"]
    assert max(lls) - min(lls) > 0.1


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[1] in ("generate", "code")])
def test_generations_equal_lm_eval(both, name):
    harness, ours = both
    h, o = harness[name], ours[name].samples
    key = "generation" if CASES[name][1] == "generate" else "completion"
    assert [s[key] for s in o] == [s["resps"][0][0] for s in h], name
    assert any(s[key] for s in o)   # something was generated
    if name in ("mmlu_pro", "bbh"):  # the harness's filter and exact_match
        assert [float(s["match"]) for s in o] == [float(s["exact_match"]) for s in h], name


def test_bits_per_byte_rolling_nll_equals_lm_eval(both):
    harness, ours = both
    h_nll = [-s["resps"][0][0] for s in harness["text"]]
    o_nll = [s["nll_nats"] for s in ours["text"].samples]
    assert o_nll == pytest.approx(h_nll, abs=1e-3)
    # the long text needs several windows of the model's 256 tokens
    assert ours["text"].samples[0]["n_tokens"] > 256
