"""The finance generator end to end against a scripted teacher over real HTTP: contexts, paraphrase
checks, 5 candidates with executed arithmetic, GenSelect, answerability, outliers and dedup."""

from __future__ import annotations

import re
import threading

import pytest

from purokit.errors import ContractError
from synth.domains.finance import load_contexts

COMPANIES = """schema: companies/1
companies:
  - {ticker: AAPL, name: "Apple Inc.", gics_sub_industry: "Technology Hardware, Storage & Peripherals"}
  - {ticker: MSFT, name: "Microsoft Corporation", gics_sub_industry: "Systems Software"}
  - {ticker: ORCL, name: "Oracle Corporation", gics_sub_industry: "Systems Software"}
"""
TEMPLATES = """schema: finance_templates/1
templates:
  - {id: gross_margin, kind: single, numeric: true, text: "What was {company}'s gross margin in fiscal {year}?"}
  - {id: main_risk, kind: single, numeric: false, text: "Which risk does {company} call most material in fiscal {year}?"}
  - {id: compare_gm, kind: comparison, numeric: true, text: "By how many points did {peer}'s fiscal {year} gross margin exceed {company}'s?"}
"""
CONTEXT = {
    "AAPL_2023": "# Apple Inc. 10-K FY2023\n\n| | 2023 |\n|---|---|\n| Total net sales | 383,285 |\n| Total cost of sales | 214,137 |\n",
    "MSFT_2023": "# Microsoft Corporation 10-K FY2023\n\n| | 2023 |\n|---|---|\n| Total revenue | 211,915 |\n| Total cost of revenue | 65,863 |\n",
    "ORCL_2023": "# Oracle Corporation 10-K FY2023 (test figures)\n\n| | 2023 |\n|---|---|\n| Total revenues | 49,954 |\n| Cost of revenues | 13,500 |\n",
}
FIGURES = {"Apple": (383285, 214137), "Microsoft": (211915, 65863), "Oracle": (49954, 13500)}


def gm_expr(name: str) -> str:
    rev, cost = FIGURES[name]
    return f"({rev} - {cost}) / {rev} * 100"


def correct(question: str) -> tuple[str, float]:
    names = [n for n in FIGURES if n in question]
    if "exceed" in question or "points" in question:
        company, peer = names[0], names[1]       # in order of mention: company first
        expr = f"(({gm_expr(peer)}) - ({gm_expr(company)}))"
    else:
        expr = gm_expr(names[0])
    return expr, eval(expr)  # noqa: S307 (test-side arithmetic on constants)


@pytest.fixture
def fin_script(script):
    counters: dict[str, int] = {}
    lock = threading.Lock()

    def paraphrase(text, req):
        q = re.search(r"Question: (.+)", text).group(1)
        if "risk" in q:
            return "1. In fiscal 2023, which risk did {c} flag as most material?".format(c=q.split("does ")[1].split(" call")[0])
        names = [n for n in FIGURES if n in q]
        if len(names) == 2:
            return (f"1. In fiscal 2023, how many percentage points higher was {names[1]}'s gross margin than {names[0]}'s?\n"
                    f"2. What was the gap between {names[1]}'s and {names[0]}'s gross margins?")          # drops the year
        return (f"1. What gross margin did {names[0]} report for fiscal 2023?\n"
                f"2. In FY2023, what was {names[0]}'s gross margin percentage?\n"
                f"3. What gross margin did {names[0]} report for fiscal 2023?")                          # repeats 1.

    def answer(text, req):
        q = re.search(r"Question: (.+)", text).group(1)
        with lock:
            i = counters.get(q, 0)
            counters[q] = i + 1
        if "risk" in q:
            return ["Supply chain concentration.\nAnswer: supply chain risk", "It depends.", "Answer: competition",
                    "Answer: currency risk", "Answer: regulation"][i % 5]
        expr, value = correct(q)
        return [f"Computing from the table.\nCalculation: {expr}\nAnswer: {value:.2f}%",
                f"Computing.\nCalculation: {expr}\nAnswer: {value + 5:.2f}%",
                "Computing.\nCalculation: (390000 - 214137) / 390000 * 100\nAnswer: 45.09%",
                "The margin is about half.",
                f"Another route, same figures.\nCalculation: {expr}\nAnswer: {value:.1f}%"][i % 5]

    def select(text, req):
        listed = [int(x) for x in re.findall(r"^Candidate (\d+):", text, re.M)]
        return f"Candidate {listed[0]} computes it from the table correctly.\nBest: {listed[0]}"

    def answerable(text, req):
        return "UNANSWERABLE" if "risk" in text.split("Question:")[1] else "ANSWERABLE"

    script.on("Rewrite this financial-analysis question", reply=paraphrase, name="paraphrase")
    script.on("You are a financial analyst.", reply=answer, name="answer")
    script.on("choosing the best of several candidate answers", reply=select, name="select")
    script.on("Reply with exactly one word: ANSWERABLE or UNANSWERABLE", reply=answerable, name="answerable")
    return script


def test_finance_generator_end_to_end(fin_script, teacher, run_gen, tmp_path, jsonl):
    (tmp_path / "companies.yaml").write_text(COMPANIES)
    (tmp_path / "templates.yaml").write_text(TEMPLATES)
    ctx = tmp_path / "contexts"
    ctx.mkdir()
    for k, v in CONTEXT.items():
        (ctx / f"{k}.md").write_text(v)
    source = {"kind": "finance_questions", "companies": str(tmp_path / "companies.yaml"),
              "templates": str(tmp_path / "templates.yaml"), "years": [2022, 2023], "max_per_template": None}
    res = run_gen("finance", teacher.base_url, tmp_path / "run", source=source,
                  step_updates={"context": {"contexts": str(ctx)}},
                  update={"post": [{"kind": "finance_outliers", "name": "outliers", "lo_pct": 20, "hi_pct": 80, "min_items": 3},
                                   {"kind": "finance_dedup", "name": "dedup"}, {"kind": "clean", "name": "clean"}]})
    assert fin_script.unmatched == []
    steps = res.manifest.steps
    # 2022 instances have no context document: dropped before any request
    assert res.manifest.counts["prompts_dropped"]["context"] == steps["context"]["in"] - steps["context"]["out"] > 0
    removals = jsonl(res.out_dir / "removals.jsonl")
    records = jsonl(res.records_path)
    assert records
    all_records = len(records) + len([x for x in removals if x["step"] == "outliers"])
    # 3 numeric single questions x 2 kept paraphrases + 2 comparisons x 1 kept paraphrase
    assert all_records == 3 * 2 + 2 * 1
    for r in records:
        m = r["meta"]
        assert m["answerability"] == "ANSWERABLE" and len(m["candidates"]) == 5
        statuses = [c["arithmetic"] for c in m["candidates"]]
        assert sorted(statuses) == sorted(["verified", "mismatch", "operand_not_in_context", "not_checked", "verified"])
        # only the candidates whose executed arithmetic checks out are eligible for GenSelect
        assert m["eligible"] == [i for i, st in enumerate(statuses) if st == "verified"]
        assert len({c["seed"] for c in m["candidates"]}) == 5 and m["selected_idx"] in m["eligible"]
        assert m["arithmetic"]["status"] == "verified"
        assert 2019 <= min(m["fiscal_years"]) and max(m["fiscal_years"]) <= 2024
        if m["kind"] == "comparison":
            assert len(m["tickers"]) == 2 and m["gics_sub_industry"] == "Systems Software"
        assert m["context_tokens"] <= 6000 and m["paraphrase_idx"] in (0, 1, 2)
        assert r["messages"][0]["content"].startswith("# ")
    reasons = [x["reason"] for x in jsonl(res.out_dir / "rejects.jsonl")]
    assert any("drops the fiscal year 2023" in x for x in reasons)
    assert any("identical to an earlier paraphrase" in x for x in reasons)
    assert sum(x == "answerability: UNANSWERABLE" for x in reasons) == 3        # the risk question, per company
    outliers = [x for x in removals if x["step"] == "outliers"]
    assert outliers and all(x["reason"] == "outlier" for x in outliers)
    lo, hi = res.manifest.post["outliers"]["bounds"]
    assert all(lo <= r["meta"]["answer_n_tokens"] <= hi for r in records)
    assert steps["arithmetic"]["in"] > steps["arithmetic"]["out"] > 0


def test_contexts_load_from_yaml_and_directories(tmp_path):
    shipped = load_contexts("finance_contexts_example.yaml")
    assert set(shipped) == {"AAPL_2023", "MSFT_2023"} and "383,285" in shipped["AAPL_2023"]
    (tmp_path / "x_2023.md").write_text("# X")
    assert load_contexts(tmp_path) == {"X_2023": "# X"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: finance_contexts/1\ncontexts: {apple: text}\n")
    with pytest.raises(ContractError, match="TICKER_YEAR"):
        load_contexts(bad)
