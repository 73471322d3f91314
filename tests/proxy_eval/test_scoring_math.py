"""Hand-checked examples for answer extraction and the metric math."""

import math
from fractions import Fraction

import pytest

from proxy_eval.extract import answers_match, extract_answer, gsm8k_gold, last_boxed, numbers_in, parse_number
from proxy_eval.metrics import (Estimate, bits_per_byte, mc_item_scores, mean_estimate, olmes_best, pass_at_k,
                                ratio_estimate)


@pytest.mark.parametrize("text,expected", [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("So the total is 1,200 dollars. The answer is $1,200.", "1200"),
    ("Thus x = \\boxed{\\frac{3}{4}} and we are done. The answer is 5", "\\frac{3}{4}"),
    ("Final answer: -12", "-12"),
    ("The temperature drops to \u22125 degrees, so the answer is \u22125.", "-5"),
    ("First 10, then 20, finally 35", "35"),
    ("He pays 3/4 of 8 which is 6. The answer is 6.", "6"),
    ("Answer: B", "B"),
    ("no digits here", None),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("the value is -0.5", "-0.5"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_last_boxed_nested_braces():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed 5") == "5"
    assert last_boxed("nothing") is None


@pytest.mark.parametrize("s,value", [
    ("1,234", Fraction(1234)), ("-3/4", Fraction(-3, 4)), ("\\frac{3}{4}", Fraction(3, 4)),
    ("-\\frac{3}{4}", Fraction(-3, 4)), ("\\dfrac{-6}{8}", Fraction(-3, 4)), ("$5.50", Fraction(11, 2)),
    ("\u22122", Fraction(-2)), ("50%", Fraction(50)), ("7 dollars", Fraction(7)), ("+3", Fraction(3)),
    (".5", Fraction(1, 2)), ("abc", None), ("1/0", None), ("3 apples and 4 pears", None),
])
def test_parse_number(s, value):
    assert parse_number(s) == value


@pytest.mark.parametrize("pred,gold,ok", [
    ("1.50", "3/2", True), ("\\frac{3}{2}", "1.5", True), ("-4", "4", False), ("4", "4.0", True),
    ("1,000", "1000", True), ("$18", "18", True), ("18 dollars", "18", True), ("B", "b", True),
    ("\\text{(C)}", "(C)", True), (None, "3", False), ("x=3", "3", True), ("3 or 4", "3", False),
])
def test_answers_match(pred, gold, ok):
    assert answers_match(pred, gold) is ok


def test_gsm8k_gold_and_numbers():
    assert gsm8k_gold("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72") == "72"
    assert numbers_in("from -3 to 4/5 then 1,000.5") == ["-3", "4/5", "1000.5"]


def test_mc_item_scores_hand_checked():
    # choice 0 has the highest total log-likelihood, choice 1 the highest per byte
    ll = [-4.0, -5.0, -9.0]
    nbytes = [2, 10, 3]
    s = mc_item_scores(ll, nbytes, gold=1)
    assert s["acc"] == 0.0 and s["acc_norm"] == 1.0
    z = math.exp(-4) + math.exp(-5) + math.exp(-9)
    assert s["prob_correct"] == pytest.approx(math.exp(-5) / z)
    # ties go to the first choice
    assert mc_item_scores([-1.0, -1.0], [1, 1], gold=0)["acc"] == 1.0
    assert mc_item_scores([-1.0, -1.0], [1, 1], gold=1)["acc"] == 0.0


def test_olmes_picks_the_better_form():
    name, est = olmes_best({"cloze": Estimate(0.4, 0.05, 100), "letters": Estimate(0.55, 0.05, 100)})
    assert name == "letters" and est.value == 0.55
    name, _ = olmes_best({"cloze": Estimate(0.5, 0.05, 100), "letters": Estimate(0.5, 0.05, 100)})
    assert name == "cloze"


def test_pass_at_k():
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 5)


def test_mean_and_ratio_estimates():
    e = mean_estimate([1, 0, 1, 1])
    assert e.value == 0.75 and e.stderr == pytest.approx(0.5 / 2)
    r = ratio_estimate([2, 4], [1, 2])
    assert r.value == 2.0 and r.stderr == 0.0
    bpb = bits_per_byte([math.log(2) * 8, math.log(2) * 4], [8, 8])
    assert bpb.value == pytest.approx(0.75)
    assert bpb.stderr > 0
