"""Benchmark inputs that do not fit their public layout: each record is checked against its preset's
layout (types, non-empty text, at least two choices, gold among the choices in the layout's own
label form, the answer marker the preset relies on) and refused naming the file, the record (and
line) and the field, or skipped and counted when told to; unreadable bytes and files name the file
and line; `python -m proxy_eval eval` prints such an error as one line with exit 2; a 10 MB
question is tokenized from the tail the model sees."""

import gzip
import json
import subprocess
import sys

import pytest

from purokit.errors import ContractError
from proxy_eval.__main__ import main
from proxy_eval.evaluate import evaluate_task
from proxy_eval.models import TorchModuleScorer
from proxy_eval.tasks import PRESETS, DataSource, TaskConfig, load_task
from tests.proxy_eval.test_tasks import TableModel, write_jsonl

GOOD = {
    "mmlu": {"question": "What is 2 + 3?", "subject": "anatomy", "choices": ["4", "5", "6", "7"], "answer": 1},
    "arc": {"question": "Which gas?", "answerKey": "B",
            "choices": {"text": ["oxygen", "carbon dioxide", "helium", "neon"], "label": ["A", "B", "C", "D"]}},
    "piqa": {"goal": "Boil water", "sol1": "Heat it.", "sol2": "Freeze it.", "label": 0},
    "gsm8k": {"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
    "math": {"problem": "1 + 1?", "solution": "We get $\\boxed{2}$."},
    "mbpp": {"text": "Write add.", "test_list": ["assert add(1, 2) == 3"], "code": "def add(a, b): return a + b"},
}

# (preset, change to the good record, the field the error must name)
DEFECTS = [
    ("mmlu", {"question": None}, "question"),
    ("mmlu", {"choices": "ABCD"}, "choices"),
    ("mmlu", {"answer": 7}, "answer"),
    ("arc", {"question": None}, "question"),
    ("arc", {"choices": {"text": ["oxygen"], "label": ["A"]}}, "choices.text"),
    ("arc", {"answerKey": "0"}, "answerKey"),
    ("piqa", {"label": True}, "label"),
    ("piqa", {"goal": ""}, "goal"),
    ("gsm8k", {"answer": "2 + 3 = 5. The answer is 5."}, "answer"),
    ("math", {"solution": "We get 2."}, "solution"),
    ("mbpp", {"test_list": "assert add(1, 2) == 3"}, "test_list"),
    ("mbpp", {"text": None, "prompt": None}, "text"),
]


def _task(preset, path, **kw):
    return TaskConfig(name=preset, format=PRESETS[preset].format, preset=preset, source=DataSource(path=str(path)),
                      **kw)


@pytest.mark.parametrize("preset,change,field", DEFECTS, ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(DEFECTS)])
def test_a_record_off_its_layout_is_refused_naming_file_record_and_field(tmp_path, preset, change, field):
    src = write_jsonl(tmp_path / f"{preset}.jsonl", [GOOD[preset], {**GOOD[preset], **change}])
    with pytest.raises(ContractError) as e:
        load_task(_task(preset, src))
    assert e.value.field == field
    assert str(e.value).startswith(f"{src} record 1 (line 2): field '{field}'")


def test_the_good_records_load():
    for preset, rec in GOOD.items():
        doc = PRESETS[preset].convert(rec, {})
        assert doc.get("query") or doc.get("question") or doc.get("prompt")


def test_bad_records_skipped_only_when_told_and_counted(tmp_path):
    src = write_jsonl(tmp_path / "piqa.jsonl", [GOOD["piqa"], {**GOOD["piqa"], "label": True},
                                                {**GOOD["piqa"], "sol2": None}, GOOD["piqa"]])
    with pytest.raises(ContractError, match="record 1"):
        load_task(_task("piqa", src))
    task = load_task(_task("piqa", src, bad_records="skip"))
    assert [d["doc_id"] for d in task.docs] == [0, 3] and len(task.skipped) == 2
    assert "record 2 (line 3): field 'sol2'" in task.skipped[1]
    lls = {("Answer:", " Heat it."): -1.0, ("Answer:", " Freeze it."): -2.0, ("Answer:", " A"): -1.0,
           ("Answer:", " B"): -2.0}
    result = evaluate_task(TableModel(lls=lls), task)
    assert result.n == 2 and result.detail["skipped_records"] == 2


def test_unreadable_bytes_and_files_name_file_and_line(tmp_path):
    good = json.dumps(GOOD["gsm8k"]).encode()
    latin = tmp_path / "latin.jsonl"
    bad = json.dumps({**GOOD["gsm8k"], "question": "caf\u00e9"}, ensure_ascii=False).encode("latin-1")
    latin.write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(ContractError, match=rf"{latin}:2: not UTF-8: byte 0xe9"):
        load_task(_task("gsm8k", latin))
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text(json.dumps(GOOD["gsm8k"]) + "\n", encoding="utf-16")
    with pytest.raises(ContractError, match=rf"{utf16}: is UTF-16 text"):
        load_task(_task("gsm8k", utf16))
    cut = tmp_path / "cut.jsonl.gz"
    whole = gzip.compress(b"".join(json.dumps({**GOOD["gsm8k"], "question": f"q{i}"}).encode() + b"\n"
                                   for i in range(200)))
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ContractError, match=rf"{cut}: cannot be read after record \d+: .*cut or damaged"):
        load_task(_task("gsm8k", cut))
    with pytest.raises(ContractError, match=rf"{tmp_path / 'gone.jsonl'}: not found"):
        load_task(_task("gsm8k", tmp_path / "gone.jsonl"))
    (tmp_path / "notads").mkdir()
    with pytest.raises(ContractError, match=r"notads: not a `datasets.save_to_disk` directory"):
        load_task(_task("gsm8k", tmp_path / "notads"))
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"question": "x \\ud800 y", "answer": "#### 5"}\n')
    with pytest.raises(ContractError, match=r"line 1\): field 'question': .*holds a lone surrogate '\\ud800'"):
        load_task(_task("gsm8k", surrogate))


def _eval_cli(suite, tmp_path):
    return subprocess.run([sys.executable, "-m", "proxy_eval", "eval", "--model", str(tmp_path / "no-model"),
                           "--suite", str(suite), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_a_bad_record_as_one_line_exit_2(tmp_path, capsys):
    src = write_jsonl(tmp_path / "mmlu.jsonl", [{**GOOD["mmlu"], "question": None}])
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"tasks:\n  - {{name: mmlu, format: multiple_choice, preset: mmlu, source: {{path: {src}}}}}\n")
    out = _eval_cli(suite, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == (f"python -m proxy_eval: error: {src} record 0 (line 1): field 'question': task "
                                  "'mmlu' (preset mmlu): expected text, found null")
    src.write_text(json.dumps({**GOOD["mmlu"], "answer": 9}) + "\n")       # in-process: returns, raises nothing
    assert main(["eval", "--model", str(tmp_path / "no-model"), "--suite", str(suite), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field 'answer': task 'mmlu' (preset mmlu): 9 is outside 0..3" in err


def test_a_10mb_question_is_tokenized_from_its_tail_with_the_same_scores(tiny_qwen, tokenizer, tmp_path):
    """Only the last max_length tokens of a context reach the model; tokenizing 10 MB whole (twice
    per choice and form) was what took minutes and GBs. The tail gives the same scores."""
    seen = []

    class Counting(TorchModuleScorer):
        def _encode(self, text):
            seen.append(len(text))
            return super()._encode(text)

    class Whole(TorchModuleScorer):
        def _tail(self, text, keep):
            return text

    fwd = dict(forward=lambda m, ids: m(input_ids=ids).logits)
    question = ("The cat sat on the mat. Paris is the capital of France. " * 200_000)[:10_000_000]
    src = write_jsonl(tmp_path / "mmlu.jsonl", [{**GOOD["mmlu"], "question": question}])
    task = load_task(_task("mmlu", src))
    counting = Counting(tiny_qwen, tokenizer, 128, **fwd)
    result = evaluate_task(counting, task)
    assert result.n == 1 and max(seen) < 20_000                 # never the 10 MB question itself
    medium = question[:60_000]
    reqs = [(f"Question: {medium}\nAnswer:", " 5"), (f"Question: {medium}\nAnswer:", " 6"), (medium, " cat")]
    whole = Whole(tiny_qwen, tokenizer, 128, **fwd).loglikelihood(reqs)
    assert counting.loglikelihood(reqs) == whole
    gen_whole = Whole(tiny_qwen, tokenizer, 128, **fwd).generate([medium], max_new_tokens=3)
    assert counting.generate([medium], max_new_tokens=3) == gen_whole
