"""Financial-reasoning generator (Nemotron 3 Super §3.1.1 "Financial reasoning"; spec §2.4 and
testable behaviours 13-15; FinLLMs' executed arithmetic).

Per template instance (a seed question template filled with a company, a fiscal year and, for a
comparison, a peer of the same GICS sub-industry), the steps of `finance.yaml`:

  finance_context     the user's markdown context documents for the instance, under a token cap
  finance_paraphrase  up to 3 distinct paraphrases that keep every company and year
  finance_answers     5 candidate answers per question from different seeds, each ending with a
                      `Calculation:` (numeric questions) and an `Answer:`
  finance_arithmetic  each numeric candidate's calculation is executed; its operands must be
                      figures of the context and its result must equal the stated answer; where
                      some candidates verify, only those stay eligible (prefer executed arithmetic)
  finance_genselect   GenSelect: a judge picks the best eligible candidate (numerical accuracy,
                      financial methodology, logical rigor)
  finance_answerable  a classifier labels the question and selected answer ANSWERABLE or not
  format_finance      one record per question

Post: `finance_outliers` (percentile band of the answer length) and `finance_dedup` (exact and
near-duplicate questions), then the engine's `clean`.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any, Iterator

from pydantic import Field

from purokit.config import StrictModel
from purokit.errors import ContractError
from purokit.hashing import stable_id
from purokit.records import SynthRecord, Verification
from synth.checkpool import CheckTimeout
from synth.domains import finance_validate as fv
from synth.domains.seeds import load_companies, load_finance_templates, read_seed_file, resolve_seed_path
from synth.pipeline import (Ask, Candidate, PostStep, Row, Step, register_post_step, register_source,
                           register_step, render, sampling_config)
from synth.steps import JudgeParams

MAX_PARAPHRASES = 3          # §3.1.1: up to 3 distinct phrasings per combination
N_CANDIDATES = 5             # GenSelect over 5 candidates from different seeds


# ---- contexts --------------------------------------------------------------------------------------

def load_contexts(path: str | os.PathLike) -> dict[str, str]:
    """Context documents by key TICKER_YEAR: a directory of `TICKER_YEAR.md` files or a YAML file
    `{schema: finance_contexts/1, contexts: {TICKER_YEAR: markdown}}`."""
    p = resolve_seed_path(path)
    if p.is_dir():
        return {f.stem.upper(): f.read_text(encoding="utf-8") for f in sorted(p.glob("*.md"))}
    raw = read_seed_file(p)
    if not isinstance(raw, dict) or raw.get("schema") != "finance_contexts/1" or not isinstance(raw.get("contexts"), dict):
        raise ContractError(p, "expected {schema: finance_contexts/1, contexts: {TICKER_YEAR: markdown}}", field="schema")
    bad = [k for k, v in raw["contexts"].items() if not re.fullmatch(r"[A-Z.\-]+_\d{4}", str(k)) or not isinstance(v, str)]
    if bad:
        raise ContractError(p, f"context keys must be TICKER_YEAR with markdown text; bad: {bad[:3]}", field="contexts")
    return {str(k): v for k, v in raw["contexts"].items()}


# ---- source ----------------------------------------------------------------------------------------

@register_source("finance_questions")
def finance_question_source(seed: int, companies: str = "companies.yaml", templates: str = "finance_templates.yaml",
                            years: list[int] | None = None, max_per_template: int | None = 50,
                            tickers: list[str] | None = None, template_ids: list[str] | None = None,
                            year_range: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Template instances over the company table and fiscal years (comparisons within one GICS
    sub-industry), sampled to `max_per_template` each with the generator seed; every instance is
    checked by `instance_problems` (the check that rejects a cross-sub-industry comparison)."""
    table = load_companies(companies)
    if tickers:
        missing = sorted(set(tickers) - {c.ticker for c in table})
        if missing:
            raise ContractError(companies, f"tickers not in the company table: {missing}", field="tickers")
        table = [c for c in table if c.ticker in tickers]
    temps = [t for t in load_finance_templates(templates) if not template_ids or t.id in template_ids]
    yrs = list(years or range(2019, 2025))
    lo, hi = year_range or [2019, 2024]
    by_ticker = {c.ticker: c for c in load_companies(companies)}
    for inst in fv.expand_templates(temps, table, yrs, random.Random(seed), max_per_template):
        problems = fv.instance_problems(inst, by_ticker, (lo, hi))
        if problems:
            raise ContractError(templates, f"instance {inst.combo_key} breaks the rules: {'; '.join(problems)}")
        yield {"id": "fin-" + stable_id(inst.combo_key, n_hex=16), "prompt": inst.question, **inst.to_dict(),
               "company_names": [by_ticker[t].name for t in inst.tickers], "category": "finance"}


def _fields(row: Row, **extra: Any) -> dict[str, Any]:
    out = dict(row.fields)
    out.update(extra)
    return out


# ---- steps -----------------------------------------------------------------------------------------

def check_arithmetic(answer: str, context_md: str, rel_tol: float) -> fv.ArithmeticCheck:
    """`finance_validate.check_arithmetic` (run in the check pool: `9**9**9` must not stall the run)."""
    return fv.check_arithmetic(answer, context_md, rel_tol=rel_tol)


@register_step("finance_context")
class FinanceContext(Step):
    """Attach the context documents (one per company, for the instance's latest fiscal year),
    each capped to its share of `max_context_tokens`; drop the instance when one is missing."""

    class Config(StrictModel):
        contexts: str = "finance_contexts_example.yaml"
        max_context_tokens: int = 6000

    _loaded: dict[str, dict[str, str]] = {}

    async def apply(self, row: Row) -> None:
        src = resolve_seed_path(self.cfg.contexts)
        key = f"{src.resolve()}@{src.stat().st_mtime_ns if src.exists() else 0}"
        if key not in FinanceContext._loaded:
            FinanceContext._loaded[key] = load_contexts(src)
        docs = FinanceContext._loaded[key]
        year = max(row.fields["fiscal_years"])
        keys = [f"{t}_{year}" for t in row.fields["tickers"]]
        missing = [k for k in keys if k not in docs]
        if missing:
            self.count(row, 1, 0)
            row.drop(self.name, f"no context document for {', '.join(missing)}")
            return
        share = self.cfg.max_context_tokens // len(keys)
        parts, n_tokens, truncated = [], 0, False
        for k in keys:
            text, n, cut = fv.cap_markdown(docs[k], share)
            parts.append(text.strip())
            n_tokens += n
            truncated |= cut
        row.fields.update(context_md="\n\n".join(parts) + "\n", context_keys=keys, context_truncated=truncated,
                          context_tokens=fv.count_tokens_regex("\n\n".join(parts) + "\n"))
        self.count(row, 1, 1)


PARAPHRASE_PROMPT = """Rewrite this financial-analysis question in {n} different ways. Keep its meaning exactly: the same companies ({company_list}), the same fiscal years ({year_list}) and the same metric. Vary the wording and sentence structure.

Question: {question}

Write one rewrite per line, numbered 1. to {n}., and nothing else."""

ANSWER_PROMPT = """You are a financial analyst. Use only the filing excerpts below.

{context_md}

Question: {question}

Reason step by step from the figures in the excerpts. {calc_instruction}End with a line "Answer: <the answer>"."""

CALC_INSTRUCTION = ("Then write a line \"Calculation: <one arithmetic expression using the figures exactly as they appear "
                    "in the excerpts>\", for example \"Calculation: (383285 - 214137) / 383285 * 100\". ")

SELECT_PROMPT = """You are a senior financial analyst choosing the best of several candidate answers.

Filing excerpts:
{context_md}

Question: {question}

{candidates}

Judge each candidate on numerical accuracy, financial methodology and logical rigor, then name the best one on the last line as "Best: <candidate number>"."""

ANSWERABLE_PROMPT = """Filing excerpts:
{context_md}

Question: {question}

Proposed answer:
{answer}

Can the question be answered completely and substantively from these excerpts, and does the proposed answer do so? Reply with exactly one word: ANSWERABLE or UNANSWERABLE."""

_NUMBERED_RE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s*(.+?)\s*$")


@register_step("finance_paraphrase")
class FinanceParaphrase(Step):
    class Config(sampling_config("writer", PARAPHRASE_PROMPT, temperature=0.8, max_tokens=300)):
        n: int = Field(default=3, ge=1, le=MAX_PARAPHRASES)

    async def apply(self, row: Row) -> None:
        companies = {t: fv.Company(t, n, row.fields["gics_sub_industry"]) for t, n in zip(row.fields["tickers"], row.fields["company_names"])}
        fields = _fields(row, n=self.cfg.n, company_list=", ".join(row.fields["company_names"]),
                         year_list=", ".join(map(str, row.fields["fiscal_years"])))
        res = await self.ask_template(row, fields, "paraphrase")
        inst = fv.Instance(**{k: row.fields[k] for k in ("template_id", "kind", "tickers", "gics_sub_industry",
                                                         "fiscal_years", "question", "numeric", "sections")})
        lines = [m.group(1).strip().strip('"') for line in res.content.splitlines() if (m := _NUMBERED_RE.match(line))]
        if not lines:
            c = self.add_candidate(row, "question", res.content, self.cfg.teacher, self.cfg.params, res,
                              self.request_seed(row, "paraphrase"), paraphrase_idx=-1)
            self.reject(row, c, "no numbered paraphrase lines in the reply")
            self.count(row, 1, 0)
            return
        cands = [self.add_candidate(row, "question", text, self.cfg.teacher, self.cfg.params, res,
                                    self.request_seed(row, "paraphrase"), paraphrase_idx=i)
                 for i, text in enumerate(lines[: self.cfg.n])]
        kept: list[str] = []

        def distinct(c: Candidate) -> str | None:       # in order: each is compared with the ones kept before it
            problems = fv.paraphrase_problems(c.text, inst, companies, earlier=kept)
            if not problems:
                kept.append(c.text)
            return "; ".join(problems) or None

        await self.keep(row, cands, distinct)


@register_step("finance_answers")
class FinanceAnswers(Step):
    """5 candidates per question, each from its own seed."""

    class Config(sampling_config("answerer", ANSWER_PROMPT, temperature=0.8, max_tokens=800)):
        n: int = Field(default=N_CANDIDATES, ge=2)

    async def apply(self, row: Row) -> None:
        questions = self.alive(row, "question")
        calc = CALC_INSTRUCTION if row.fields.get("numeric") else ""
        cands = await self.sample(row, "answer", *(
            Ask(_fields(row, question=q.text, calc_instruction=calc), ("answer", q.index, j), {"question": q.index, "candidate_idx": j})
            for q in questions for j in range(self.cfg.n)))
        kept = 0
        for c in cands:
            c.parsed["final_answer"] = fv.parse_final_answer(c.text)
            why = "truncated at max_tokens" if c.result.finish_reason == "length" else (
                None if c.parsed["final_answer"] else "no 'Answer:' line")
            if why:
                c.parsed["format_problem"] = why
            else:
                kept += 1
        # candidates stay listed (GenSelect sees exactly n per question); the format verdict decides eligibility
        self.count(row, len(cands), kept)


@register_step("finance_arithmetic")
class FinanceArithmetic(Step):
    class Config(StrictModel):
        rel_tol: float = 5e-3
        prefer_verified: bool = True
        require_verified: bool = False

    async def apply(self, row: Row) -> None:
        answers = row.candidates.get("answer", [])
        n_checked = n_verified = 0
        for q in self.alive(row, "question"):
            cands = [c for c in answers if c.parsed["question"] == q.index]
            for c in cands:
                if c.parsed.get("format_problem"):
                    c.parsed["arithmetic"] = {"status": "not_checked"}
                    continue
                if row.fields.get("numeric"):
                    try:
                        chk = await self.check(check_arithmetic, c.text, row.fields["context_md"], self.cfg.rel_tol)
                        c.parsed["arithmetic"] = chk.to_dict()
                    except CheckTimeout as e:
                        chk = None
                        c.parsed["arithmetic"] = {"status": "timeout", "detail": str(e)}
                    n_checked += 1
                    n_verified += bool(chk and chk.verified)
                else:
                    c.parsed["arithmetic"] = {"status": "not_numeric"}
            formatted = [c for c in cands if not c.parsed.get("format_problem")]
            verified = [c for c in formatted if c.parsed["arithmetic"].get("status") == "verified"]
            eligible = verified if (verified and self.cfg.prefer_verified) else formatted
            if row.fields.get("numeric") and self.cfg.require_verified and not verified:
                eligible = []
            q.parsed["eligible"] = [c.parsed["candidate_idx"] for c in eligible]
            q.parsed["arithmetic_verified"] = bool(verified)
            if not eligible:
                self.reject(row, q, "no eligible candidate (" + ("none has verified arithmetic" if formatted else
                                                                "none has an 'Answer:' line") + ")")
        self.count(row, n_checked, n_verified)


@register_step("finance_genselect")
class FinanceGenSelect(Step):
    class Config(StrictModel):
        judge: JudgeParams = Field(default_factory=lambda: JudgeParams(teacher="judge", constrained=False,
                                                                       params={"temperature": 0.0, "max_tokens": 400}))
        template: str = SELECT_PROMPT

    async def apply(self, row: Row) -> None:
        answers = row.candidates.get("answer", [])

        async def select(q: Candidate) -> str | None:
            cands = {c.parsed["candidate_idx"]: c for c in answers if c.parsed["question"] == q.index}
            listing = "\n\n".join(f"Candidate {i}:\n{cands[i].text.strip()}" for i in q.parsed["eligible"])
            res = await self.ask(row, self.cfg.judge.teacher, [{"role": "user", "content": render(self.cfg.template, _fields(
                row, question=q.text, candidates=listing))}], "select", q.index, params=self.cfg.judge.params)
            try:
                idx = fv.parse_selection(res.content, q.parsed["eligible"])
            except ValueError as e:
                return f"GenSelect: {e}"
            q.parsed.update(selected_idx=idx, judge_rationale=res.content.strip()[-600:],
                            judge_model=self.env.backend(self.cfg.judge.teacher).cfg.model)
            return None

        await self.keep(row, "question", select)


@register_step("finance_answerable")
class FinanceAnswerable(Step):
    Config = sampling_config("classifier", ANSWERABLE_PROMPT, temperature=0.0, max_tokens=8)

    async def apply(self, row: Row) -> None:
        answers = row.candidates.get("answer", [])

        async def answerable(q: Candidate) -> str | None:
            sel = next(c for c in answers if c.parsed["question"] == q.index and c.parsed["candidate_idx"] == q.parsed["selected_idx"])
            res = await self.ask_template(row, _fields(row, question=q.text, answer=sel.text.strip()), "answerable", q.index)
            try:
                label = fv.parse_answerability(res.content)
            except ValueError as e:
                label = f"unparseable ({e})"
            q.parsed["answerability"] = label
            return None if label == "ANSWERABLE" else f"answerability: {label}"

        await self.keep(row, "question", answerable)


@register_step("format_finance")
class FormatFinance(Step):
    class Config(StrictModel):
        user_template: str = "{context_md}\n{question}"

    async def apply(self, row: Row) -> None:
        questions = self.alive(row, "question")
        answers = row.candidates.get("answer", [])
        for q in questions:
            cands = sorted((c for c in answers if c.parsed["question"] == q.index), key=lambda c: c.parsed["candidate_idx"])
            sel = next(c for c in cands if c.parsed["candidate_idx"] == q.parsed["selected_idx"])
            arith = sel.parsed.get("arithmetic", {})
            meta = {
                "template_id": row.fields["template_id"], "tickers": row.fields["tickers"],
                "gics_sub_industry": row.fields["gics_sub_industry"], "fiscal_years": row.fields["fiscal_years"],
                "kind": row.fields["kind"], "original_question": row.fields["question"],
                "paraphrase_idx": q.parsed["paraphrase_idx"], "question": q.text,
                "filing_refs": row.fields.get("sections", []), "context_keys": row.fields["context_keys"],
                "context_md": row.fields["context_md"], "context_tokens": row.fields["context_tokens"],
                "context_truncated": row.fields["context_truncated"],
                "candidates": [{"seed": c.teacher.get("seed"), "answer": c.parsed["final_answer"],
                                "arithmetic": c.parsed.get("arithmetic", {}).get("status"),
                                "format_problem": c.parsed.get("format_problem")} for c in cands],
                "eligible": q.parsed["eligible"], "selected_idx": q.parsed["selected_idx"],
                "judge_model": q.parsed["judge_model"], "judge_rationale": q.parsed["judge_rationale"],
                "answerability": q.parsed["answerability"], "answer": sel.parsed["final_answer"],
                "arithmetic": arith, "answer_n_tokens": fv.count_tokens_regex(sel.text),
            }
            verification = Verification(method="genselect+answerability" + ("+executed_arithmetic" if arith.get("status") == "verified" else ""),
                                        verdict=True, rule=f"judge picked {q.parsed['selected_idx']} of {len(cands)}; ANSWERABLE",
                                        detail=f"arithmetic {arith.get('status')}")
            msgs = [{"role": "user", "content": render(self.cfg.user_template, _fields(row, question=q.text))},
                    {"role": "assistant", "content": sel.text.strip()}]
            self.record(row, ("finance", q.index), msgs, teacher=sel.teacher,
                                            verification=verification, meta=meta, category="finance")
        self.count(row, len(questions), len(questions))


@register_post_step("finance_outliers")
class FinanceOutliers(PostStep):
    """Drop records whose answer length lies outside the [lo, hi] percentile band (skipped below
    `min_items` records, where percentiles say nothing)."""

    class Config(StrictModel):
        feature: str = "answer_n_tokens"
        lo_pct: float = 1.0
        hi_pct: float = 99.0
        min_items: int = 100

    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        kept, removed, bounds = fv.remove_outliers(records, lambda r: float(r.meta[self.cfg.feature]),
                                                   self.cfg.lo_pct, self.cfg.hi_pct, self.cfg.min_items)
        self.summary = {"bounds": list(bounds) if bounds else None, "removed": len(removed)}
        return kept, [{"id": r.id, "prompt_id": r.prompt_id, "step": self.name, "reason": "outlier",
                       self.cfg.feature: r.meta[self.cfg.feature], "bounds": list(bounds or ())} for r in removed]


@register_post_step("finance_dedup")
class FinanceDedup(PostStep):
    class Config(StrictModel):
        near_threshold: float = 0.8

    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        kept, removed = fv.dedup_questions(records, lambda r: r.meta["question"], self.cfg.near_threshold)
        self.summary = {"removed": len(removed)}
        return kept, [{"id": r.id, "prompt_id": r.prompt_id, "step": self.name, "reason": why.replace(" ", "_"),
                       "question": r.meta["question"]} for r, why in removed]
