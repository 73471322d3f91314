"""MCQ with knowledge/reasoning traces (Nemotron 3 Super §2.3.6; spec §1.7, testable behaviour 7).

Per seed question of a user-supplied MCQ set, the steps of `mcq.yaml`:

  mcq_generate   the generator writes several look-alike questions (same format, difficulty and
                 number of options), each its own request; parsed and checked (`mcq_validate`)
  mcq_solve      each question is solved N >= 3 times with different seeds; the answer chosen by a
                 strict majority of all samples wins (none -> the question emits nothing);
                 optionally the generator's own key must agree; the traces that agree are kept
  format_mcq     one record per kept trace: the question -> the reasoning and answer
"""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import Field

from synth.domains import mcq_validate as mv
from purokit.config import StrictModel
from synth.domains.seeds import load_mcq_seeds
from synth.pipeline import Ask, Candidate, Row, Step, register_source, register_step, sampling_config
from purokit.records import Verification


@register_source("mcq_seeds")
def mcq_seed_source(seed: int, path: str = "mcq_seeds.yaml") -> Iterator[dict[str, Any]]:
    for s in load_mcq_seeds(path):
        mcq = mv.Mcq(s.question, dict(s.options), s.answer)
        yield {"id": f"mcq-{s.id}", "prompt": mcq.render(), "seed_id": s.id, "seed_source": s.source,
               "seed_question": s.question, "seed_rendered": mcq.render() + f"\nAnswer: {s.answer}",
               "n_options": len(s.options), "letters": "".join(s.options), "category": "mcq"}


GENERATE_PROMPT = """Here is a multiple-choice question with {n_options} options and its answer:

{seed_rendered}

Write one new multiple-choice question in the same format, on a related topic and of the same difficulty, with exactly {n_options} options ({letters}) and exactly one correct option. This is variant {variant}; do not copy the question above.

Answer in exactly this form:
Question: <the question>
A) <option>
B) <option>
...
Answer: <letter>"""

SOLVE_PROMPT = """Answer this multiple-choice question. First explain the knowledge or reasoning that leads to the answer, step by step, then give the letter on the last line as "Answer: <letter>".

{question}"""


@register_step("mcq_generate")
class McqGenerate(Step):
    class Config(sampling_config("generator", GENERATE_PROMPT, temperature=0.9, max_tokens=300)):
        n: int = Field(default=3, ge=1)

    async def apply(self, row: Row) -> None:
        cands = await self.sample(row, "question", *(Ask(dict(row.fields, variant=i + 1), ("question", i), {"variant": i})
                                                     for i in range(self.cfg.n)))
        await self.keep(row, cands, lambda c: self.parse(c, row))

    @staticmethod
    def parse(c: Candidate, row: Row) -> str | None:
        try:
            mcq = mv.parse_mcq(c.text)
            problems = mv.mcq_problems(mcq, row.fields["n_options"], row.fields["seed_question"])
        except ValueError as e:
            problems = [str(e)]
        if problems:
            return "; ".join(problems)
        c.parsed["mcq"] = mcq.to_dict()
        return None


@register_step("mcq_solve")
class McqSolve(Step):
    """N solutions per question; keep the traces agreeing with a strict majority (and the key)."""

    class Config(sampling_config("solver", SOLVE_PROMPT, temperature=0.7, max_tokens=400)):
        n: int = Field(default=4, ge=3)
        require_key_agreement: bool = True

    async def apply(self, row: Row) -> None:
        questions = self.alive(row, "question")
        jobs = [(q, j) for q in questions for j in range(self.cfg.n)]
        cands = await self.sample(row, "solution", *(
            Ask({"question": mv.Mcq(**q.parsed["mcq"]).render()}, ("solve", q.index, j), {"question": q.index, "sample": j})
            for q, j in jobs))
        by_q: dict[int, list[Any]] = {}
        for (q, _), c in zip(jobs, cands):
            mcq = mv.Mcq(**q.parsed["mcq"])
            c.parsed["choice"] = None if c.result.finish_reason == "length" else mv.parse_choice(c.text, list(mcq.options))
            by_q.setdefault(q.index, []).append(c)
        n_kept_q = 0
        for q in questions:
            sols = by_q.get(q.index, [])
            majority, share = mv.strict_majority([c.parsed["choice"] for c in sols])
            key = q.parsed["mcq"]["answer"]
            q.parsed.update(majority=majority, vote_share=share,
                            samples=[{"seed": c.teacher.get("seed"), "answer": c.parsed["choice"]} for c in sols])
            why = None
            if majority is None:
                why = f"no strict majority over {len(sols)} solutions (best share {share:.2f})"
            elif self.cfg.require_key_agreement and majority != key:
                why = f"majority answer {majority} disagrees with the generated key {key}"
            if why:
                self.reject(row, q, why)
                for c in sols:
                    self.reject(row, c, "question dropped: " + why)
                continue
            n_kept_q += 1
            for c in sols:
                if c.parsed["choice"] != majority:
                    self.reject(row, c, f"answer {c.parsed['choice']} disagrees with the majority {majority}")
        self.count(row, len(questions), n_kept_q)


@register_step("format_mcq")
class FormatMcq(Step):
    class Config(StrictModel):
        max_traces_per_question: int | None = None

    async def apply(self, row: Row) -> None:
        qs = {q.index: q for q in self.alive(row, "question")}
        alive = [c for c in self.alive(row, "solution") if c.parsed["question"] in qs]
        taken: dict[int, int] = {}
        n_out = 0
        for c in alive:
            q = qs[c.parsed["question"]]
            if self.cfg.max_traces_per_question is not None and taken.get(q.index, 0) >= self.cfg.max_traces_per_question:
                continue
            taken[q.index] = taken.get(q.index, 0) + 1
            mcq = mv.Mcq(**q.parsed["mcq"])
            meta = {"seed_id": row.fields["seed_id"], "seed_source": row.fields["seed_source"], "question": mcq.question,
                    "options": mcq.options, "n_options": len(mcq.options), "key": mcq.answer,
                    "solver_samples": q.parsed["samples"], "majority_answer": q.parsed["majority"],
                    "vote_share": q.parsed["vote_share"], "answer": c.parsed["choice"], "variant": q.parsed["variant"],
                    "generator_model": q.teacher.get("model")}
            verification = Verification(method="majority_vote", verdict=True, score=q.parsed["vote_share"],
                                        rule="strict majority" + (" = key" if mcq.answer == q.parsed["majority"] else ""))
            msgs = [{"role": "user", "content": mcq.render()}, {"role": "assistant", "content": c.text.strip()}]
            self.record(row, ("mcq", q.index, c.parsed["sample"]), msgs, teacher=c.teacher,
                                            verification=verification, meta=meta, category="mcq")
            n_out += 1
        self.count(row, len(alive), n_out)
