"""MCQ validators: question parsing, look-alike checks, answer letters and the strict majority."""

from __future__ import annotations

import pytest

from synth.domains.mcq_validate import mcq_problems, parse_choice, parse_mcq, strict_majority

GOOD = """Here is a new question in the same style.

Question: Which gas do plants take in from the air to make their food
during photosynthesis?
A) Oxygen
B) Carbon dioxide
C) Nitrogen
D) Helium
Answer: B
"""


def test_a_well_formed_question_is_parsed():
    m = parse_mcq(GOOD)
    assert m.question == "Which gas do plants take in from the air to make their food during photosynthesis?"
    assert m.options == {"A": "Oxygen", "B": "Carbon dioxide", "C": "Nitrogen", "D": "Helium"}
    assert m.answer == "B"
    assert mcq_problems(m, 4, seed_question="Which part of a plant absorbs water?") == []
    assert "D) Helium" in m.render() and "Answer" not in m.render()


@pytest.mark.parametrize("text,why", [
    ("A) x\nB) y\nAnswer: A", "no 'Question:'"),
    ("Question: Pick one.\nA) only\nAnswer: A", "need at least 2"),
    ("Question: Pick one.\nA) x\nC) y\nAnswer: A", "lettered AC"),
    ("Question: Pick one.\nA) x\nB) y", "no 'Answer: X'"),
])
def test_malformed_questions_are_rejected(text, why):
    with pytest.raises(ValueError, match=why):
        parse_mcq(text)


def test_look_alike_rules():
    m = parse_mcq(GOOD)
    assert mcq_problems(m, 5) == ["4 options, the seed has 5"]
    dup = parse_mcq("Question: Which is a mammal?\nA) Whale\nB) whale.\nC) Shark\nAnswer: A")
    assert "two options are the same" in mcq_problems(dup, 3)
    bad_key = parse_mcq("Question: Which is a mammal?\nA) Whale\nB) Trout\nAnswer: C")
    assert "key C is not one of the options AB" in mcq_problems(bad_key, 2)
    copy = parse_mcq("Question: Which is a mammal?\nA) Whale\nB) Trout\nAnswer: A")
    assert "the question repeats the seed question" in mcq_problems(copy, 2, seed_question="which is a MAMMAL")


@pytest.mark.parametrize("text,letter", [
    ("Plants absorb CO2 ... so the answer is B.", "B"),
    ("Reasoning...\nAnswer: (C)", "C"),
    ("**Final answer:** D", "D"),
    ("I think A, but on reflection \\boxed{B}", "B"),
    ("The answer is E", None),          # not an option of a 4-option question
    ("I cannot decide.", None),
])
def test_choice_letters(text, letter):
    assert parse_choice(text, ["A", "B", "C", "D"]) == letter


def test_strict_majority_counts_every_sample():
    assert strict_majority(["B", "B", "C"]) == ("B", pytest.approx(2 / 3))
    assert strict_majority(["B", "B", "C", "C"])[0] is None          # a tie is no majority
    assert strict_majority(["B", None, None])[0] is None             # unparsable samples count against
    assert strict_majority(["A", "A", None, "C", "A"]) == ("A", pytest.approx(0.6))
    assert strict_majority([]) == (None, 0.0)


@pytest.mark.parametrize("text,letter", [
    ("Answer: A ... actually B", "B"),               # the last explicit statement, not the first pattern
    ("Answer: B. For instance, e.g. option C would need a leaf.", "B"),   # "e.g." is no answer E
    ("Some say (A). The answer is (D).", "D"),
    ("**Final answer:** C\n\nOn reflection, the answer is A.", "A"),
])
def test_choice_letters_by_position(text, letter):
    assert parse_choice(text, ["A", "B", "C", "D"]) == letter
