"""Finance validators: template expansion within GICS sub-industries, paraphrase checks, token
cap, executed arithmetic against the context, GenSelect/answerability parsing, outliers, dedup."""

from __future__ import annotations

import random

import pytest

from purokit.errors import ContractError
from synth.domains.finance_validate import (
    Instance,
    cap_markdown,
    check_arithmetic,
    count_tokens_regex,
    dedup_questions,
    eval_arithmetic,
    expand_templates,
    instance_problems,
    numbers_in_text,
    paraphrase_problems,
    parse_answerability,
    parse_selection,
    percentile_bounds,
    remove_outliers,
    stated_number,
)
from synth.domains.seeds import load_companies, load_finance_templates

CONTEXT = """# Apple Inc. — Form 10-K, fiscal 2023 (excerpt, USD millions)

## Item 8. Consolidated Statements of Operations

| | 2023 | 2022 |
|---|---|---|
| Total net sales | 383,285 | 394,328 |
| Total cost of sales | 214,137 | 223,546 |
| Research and development | 29,915 | 26,251 |
| Operating income | 114,301 | 119,437 |
| Net income | 96,995 | 99,803 |
"""


@pytest.fixture(scope="module")
def companies():
    return {c.ticker: c for c in load_companies()}


@pytest.fixture(scope="module")
def templates():
    return load_finance_templates()


def test_expansion_pairs_companies_only_within_one_sub_industry(companies, templates):
    insts = expand_templates(templates, list(companies.values()), range(2019, 2025), random.Random(0))
    comparisons = [i for i in insts if i.kind == "comparison"]
    assert comparisons and len(insts) > 1000
    for i in insts:
        assert instance_problems(i, companies, (2019, 2024)) == []
        assert "{" not in i.question
    for i in comparisons:
        a, b = (companies[t] for t in i.tickers)
        assert a.gics_sub_industry == b.gics_sub_industry == i.gics_sub_industry and a.ticker != b.ticker
    # every same-sub-industry ordered pair appears for a comparison template and year
    semis = [c for c in companies.values() if c.gics_sub_industry == "Semiconductors"]
    pairs = {tuple(i.tickers) for i in comparisons if i.template_id == "compare_rd" and i.fiscal_years == [2021]}
    assert len([p for p in pairs if companies[p[0]].gics_sub_industry == "Semiconductors"]) == len(semis) * (len(semis) - 1)
    growth = next(i for i in insts if i.template_id == "revenue_growth")
    assert growth.fiscal_years[1] - growth.fiscal_years[0] == 1


def test_sampling_is_capped_and_deterministic(companies, templates):
    a = expand_templates(templates, list(companies.values()), [2022, 2023], random.Random(5), max_per_template=7)
    b = expand_templates(templates, list(companies.values()), [2022, 2023], random.Random(5), max_per_template=7)
    assert [i.to_dict() for i in a] == [i.to_dict() for i in b]
    assert len(a) == 7 * len(templates)


def test_a_comparison_across_sub_industries_is_rejected(companies):
    cross = Instance("compare_rd", "comparison", ["NVDA", "XOM"], "Semiconductors", [2023],
                     "In fiscal 2023, did NVIDIA or Exxon spend more on R&D?")
    assert instance_problems(cross, companies, (2019, 2024)) == [
        "comparison across GICS sub-industries: Integrated Oil & Gas vs Semiconductors"]
    odd = Instance("gross_margin", "single", ["ZZZZ"], "x", [2018], "q")
    assert instance_problems(odd, companies, (2019, 2024)) == ["ticker ZZZZ is not in the company table",
                                                               "fiscal year 2018 outside 2019-2024"]


def test_a_bad_template_file_is_refused(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("schema: finance_templates/1\ntemplates:\n  - {id: x, kind: comparison, text: 'How did {company} do in {year}?'}\n")
    with pytest.raises(ContractError, match="comparison needs a {peer}"):
        load_finance_templates(p)


def test_paraphrases_must_keep_companies_and_years(companies):
    inst = Instance("compare_gross_margin", "comparison", ["KO", "PEP"], "Soft Drinks & Non-alcoholic Beverages", [2022],
                    "Which company had the higher gross margin in fiscal 2022, The Coca-Cola Company or PepsiCo, Inc., and by how many percentage points?")
    good = "In FY2022, whose gross margin was higher — Coca-Cola's or PepsiCo's — and by how many points?"
    assert paraphrase_problems(good, inst, companies) == []
    assert paraphrase_problems("In 2022, was KO's gross margin above PEP's, and by how much?", inst, companies) == []
    assert "drops the company PepsiCo, Inc. (PEP)" in paraphrase_problems("Was Coca-Cola's 2022 gross margin high?", inst, companies)
    assert "drops the fiscal year 2022" in paraphrase_problems("Whose gross margin was higher, KO or PEP?", inst, companies)
    assert "identical to the original question" in paraphrase_problems(inst.question.upper(), inst, companies)
    assert "identical to an earlier paraphrase" in paraphrase_problems(good, inst, companies, earlier=[good])


def test_context_is_capped_by_whole_sections():
    md = "# Title\nintro words here\n\n## A\n" + "alpha " * 50 + "\n## B\n" + "beta " * 50 + "\n"
    text, n, truncated = cap_markdown(md, 70)
    assert truncated and n <= 70 and "## A" in text and "## B" not in text
    text, n, truncated = cap_markdown(md, 10_000)
    assert not truncated and text == md and n == count_tokens_regex(md)
    text, n, truncated = cap_markdown("word " * 100, 10)        # one oversized section: cut by lines
    assert truncated and n <= 10


def test_numbers_are_read_from_financial_text():
    assert numbers_in_text("Net sales were $383,285 million, up (2.8)% from 1.5") == [383285.0, -2.8, 1.5]
    assert numbers_in_text("FY2023 and fiscal 2022") == [2022.0]


def test_arithmetic_is_executed_and_must_match_the_context_and_the_answer():
    ok = "Reasoning...\nCalculation: (383,285 - 394,328) / 394,328 * 100\nAnswer: -2.80%"
    r = check_arithmetic(ok, CONTEXT)
    assert r.verified, r
    assert r.value == pytest.approx(-2.8004, abs=1e-3)
    assert check_arithmetic("Calculation: (383285 - 214137) / 383285\nAnswer: 44.1%", CONTEXT).verified
    assert check_arithmetic("Calculation: 96995 - 99803\nAnswer: -$2.8 billion", CONTEXT).verified
    wrong = check_arithmetic("Calculation: (383285 - 394328) / 394328 * 100\nAnswer: 3.1%", CONTEXT)
    assert wrong.status == "mismatch"
    invented = check_arithmetic("Calculation: (383285 - 390000) / 390000 * 100\nAnswer: -1.72%", CONTEXT)
    assert invented.status == "operand_not_in_context" and "390000" in invented.detail
    assert check_arithmetic("Answer: about -2.8%", CONTEXT).status == "no_calculation"
    assert check_arithmetic("Calculation: __import__('os').getcwd()\nAnswer: 1", CONTEXT).status == "invalid"
    assert check_arithmetic("Answer: revenue fell", CONTEXT).status == "not_numeric"


def test_eval_arithmetic_refuses_anything_but_arithmetic():
    assert eval_arithmetic("round((10 - 4) / 4 * 100, 1)") == (150.0, [10.0, 4.0, 4.0, 100.0, 1.0])
    assert eval_arithmetic("12.5% * 200")[0] == pytest.approx(25.0)
    for bad in ("open('x')", "a + 1", "[1, 2]", "1 / 0", "2 ** 1000", "(lambda: 1)()"):
        with pytest.raises(ValueError):
            eval_arithmetic(bad)


def test_genselect_and_answerability_parsing():
    assert parse_selection("Candidate 2 computes the margin correctly.\nBest: 2", range(5)) == 2
    assert parse_selection("**Best candidate:** #3", [1, 3]) == 3
    with pytest.raises(ValueError, match="not one of"):
        parse_selection("Best: 4", [0, 1])
    with pytest.raises(ValueError, match="named no candidate"):
        parse_selection("They are all fine.", range(5))
    assert parse_answerability("Label: ANSWERABLE") == "ANSWERABLE"
    assert parse_answerability("unanswerable: the filing lacks segment data") == "UNANSWERABLE"
    with pytest.raises(ValueError):
        parse_answerability("ANSWERABLE or UNANSWERABLE, hard to say")


def test_percentile_outlier_removal():
    values = list(range(1, 201))        # 1..200
    kept, removed, (lo, hi) = remove_outliers(values, float, 1, 99, min_items=100)
    assert (lo, hi) == percentile_bounds(values, 1, 99)
    assert removed == [1, 2, 199, 200] and len(kept) == 196
    assert all(lo <= v <= hi for v in kept)
    small_kept, small_removed, bounds = remove_outliers([1, 2, 1000], float, 1, 99, min_items=100)
    assert small_removed == [] and bounds is None


def test_dedup_removes_exact_and_near_duplicates_keeping_the_first():
    qs = ["What was Apple's gross margin in fiscal 2023?",
          "what was apple's gross margin in fiscal 2023 ?",
          "What was Apple's gross margin in fiscal 2023 exactly, as reported in its annual report?",
          "What was Apple's gross margin in fiscal 2023 exactly, as reported in its annual report filing?",
          "How much did Microsoft spend on research in fiscal 2021?"]
    kept, removed = dedup_questions(qs, lambda q: q)
    assert kept == [qs[0], qs[2], qs[4]]
    assert [r for _, r in removed] == ["exact duplicate", "near duplicate of item 2"]


@pytest.mark.parametrize("answer,value", [
    ("-2.80%", -2.8),
    ("In 2023, revenue fell 2.8%.", 2.8),
    ("Revenue fell from $394,328 million to $383,285 million, a decline of 2.80%.", 2.8),
    ("-2.8% (from 394,328 in 2022 to 383,285 in 2023)", -2.8),
    ("The gross margin was 44.1% in fiscal 2023, up from 43.3%.", 44.1),
    ("$2.8 billion", 2.8),
])
def test_the_stated_number_is_the_final_answer_not_the_first_number(answer, value):
    assert stated_number(answer)[0] == pytest.approx(value)


def test_arithmetic_reads_the_final_answer_of_a_sentence():
    calc = "Calculation: (383,285 - 394,328) / 394,328 * 100\n"
    assert check_arithmetic(calc + "Answer: In 2023, net sales fell by 2.80%.", CONTEXT).verified
    assert check_arithmetic(calc + "Answer: Net sales went from $394,328 million to $383,285 million, -2.80%.", CONTEXT).verified
    wrong = check_arithmetic(calc + "Answer: In 2023, net sales fell by 3.5%.", CONTEXT)
    assert wrong.status == "mismatch" and wrong.stated == pytest.approx(3.5)


def test_an_overflowing_calculation_is_invalid_not_a_crash():
    r = check_arithmetic("Calculation: (10**100)**99\nAnswer: 1", CONTEXT)
    assert r.status == "invalid" and "not finite" in r.detail
