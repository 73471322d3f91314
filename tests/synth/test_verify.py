"""Verifiers: toggle format (LN testable 23), math answer equivalence, MC letters, majority vote."""

from __future__ import annotations

import pytest

from synth.verify import (canonical_math_key, extract_choice_letter, extract_final_answer, majority_answer,
                          math_equivalent, parse_reasoning, register_verifier, get_verifier, Outcome)


@pytest.mark.parametrize("text,ok,problem", [
    ("<think>add them</think>\nThe answer is 5.", True, ""),
    ("  <think>\nadd\n</think>5", True, ""),
    ("<think>add them\nThe answer is 5.", False, "missing"),
    ("add them</think> 5", False, "missing"),
    ("<think>a<think>b</think></think> 5", False, "repeated or nested"),
    ("<think>a</think>b<think>c</think> 5", False, "repeated or nested"),
    ("</think>x<think> 5", False, "before"),
    ("<think>   </think> 5", False, "empty think"),
    ("<think>reasoning</think>   ", False, "no final answer"),
    ("So: <think>r</think> 5", False, "text before"),
])
def test_on_mode_format(text, ok, problem):
    p = parse_reasoning(text, "on")
    assert p.ok is ok
    assert problem in p.problem


@pytest.mark.parametrize("text,ok", [
    ("The answer is 5.", True), ("<think>x</think> 5", False), ("5 </think>", False), ("   ", False)])
def test_off_mode_format(text, ok):
    assert parse_reasoning(text, "off").ok is ok


def test_on_mode_splits_think_and_answer():
    p = parse_reasoning("<think>\n2+3=5\n</think>\nThe answer is \\boxed{5}.", "on")
    assert p.think == "2+3=5" and p.answer == "The answer is \\boxed{5}."


@pytest.mark.parametrize("text,ans", [
    ("so \\boxed{\\frac{1}{2}} and \\boxed{42}", "42"),
    ("\\boxed{x^{2}+1}", "x^{2}+1"),
    ("The final answer is 17.", "17"),
    ("#### 1,250", "1,250"),
    ("I get 3 then 12 apples", "12"),
    ("no numbers here", None),
])
def test_extract_final_answer(text, ans):
    assert extract_final_answer(text) == ans


@pytest.mark.parametrize("a,b,eq", [
    ("42", "42", True), ("42.0", "42", True), ("1,000", "1000", True), ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "3/4", True), ("50%", "0.5", True), ("$12", "12", True), ("2x+x", "3x", True),
    ("\\sqrt{4}", "2", True), ("(1, 2)", "(1,2)", True), ("12 apples", "12", True),
    ("41", "42", False), ("x+1", "x+2", False), ("", "0", False), (None, "1", False), ("(1,2)", "(2,1)", False),
])
def test_math_equivalence(a, b, eq):
    assert math_equivalent(a, b) is eq


def test_sympy_guard_refuses_huge_expressions_quickly():
    big = "+".join(["x"] * 500)
    assert math_equivalent(big, "500x") is False       # over the size guard: no sympy call, no hang


@pytest.mark.parametrize("text,letter", [
    ("The answer is (C).", "C"), ("\\boxed{B}", "B"), ("D", "D"), ("I think (a) then answer: b", "B"), ("none", None)])
def test_choice_letter(text, letter):
    assert extract_choice_letter(text) == letter


def test_majority_vote_groups_equivalent_answers_and_breaks_ties_by_first_seen():
    assert majority_answer(["0.5", "1/2", "3", "\\frac{1}{2}", None]) == ("0.5", 3)
    assert majority_answer(["7", "8", "8", "7"]) == ("7", 2)            # tie: first seen wins
    assert majority_answer([None, None]) == (None, 0)
    assert canonical_math_key("2x+x") == canonical_math_key("3x")


def test_verifier_registry_rejects_duplicates_and_lists_names():
    @register_verifier("test_always")
    def always(resp, ref, row):
        return Outcome(True, 1.0)
    assert get_verifier("test_always") is always
    with pytest.raises(ValueError):
        register_verifier("test_always")(lambda r, f, w: Outcome(False))
    with pytest.raises(KeyError, match="math"):
        get_verifier("nope")
