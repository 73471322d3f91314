"""Built-in steps. Per prompt: `decontaminate`, `generate`, `parse_reasoning`, `filter`,
`verify`, `judge`, `pair`, `format_sft`, `pass_rate`, `format_rl`. Over the dataset (post):
`clean`, `curriculum`. See `synth.pipeline` for how to add more."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal

from pydantic import BeforeValidator, Field
from typing_extensions import Annotated

from purokit.config import StrictModel
from purokit.hashing import stable_id
from purokit.records import TOGGLE, Message, Rollout, SynthRecord, TeacherInfo, Verification
from synth import rl
from synth.checkpool import CheckTimeout
from synth.decontam import clean_records, removal_summary
from synth.pipeline import Candidate, PostStep, Row, Step, derive_seed, register_post_step, register_step, render
from synth.toolcalls import parse_json_object
from synth.verify import ANSWER_EXTRACTORS, ANSWER_KEYS, check_json_schema, get_verifier, majority_answer, parse_reasoning

_Cfg = StrictModel


def _yaml_mode(v: Any) -> Any:
    # YAML 1.1 reads a bare on/off as a boolean; accept it as the toggle it was meant to be
    return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v


Mode = Annotated[Literal["on", "off"], BeforeValidator(_yaml_mode)]


def with_reasoning(content: str, reasoning: str | None) -> str:
    """The response text of a record: thinking a reasoning parser split off (`reasoning_content`)
    goes back in front of the answer as the `<think>...</think>` block the toggle format expects
    (unless the content already has one)."""
    if not reasoning or "<think>" in content:
        return content
    return f"<think>\n{reasoning.strip()}\n</think>\n{content.lstrip()}"


def vote(method: str, texts: list[str]) -> tuple[str | None, int]:
    """Majority answer over `texts` with the method's extractor and equivalence key (runs in the
    check pool under its time limit, like every check: the math key parses and evaluates each answer)."""
    extract = ANSWER_EXTRACTORS.get(method, ANSWER_EXTRACTORS["math"])
    key = ANSWER_KEYS.get(method, ANSWER_KEYS["math"])
    return majority_answer([extract(t) for t in texts], key)


def verify_each(verifier: Any, texts: list[str], reference: Any, fields: dict[str, Any]) -> list[Any]:
    """`verifier` over the samples of one prompt, in one check-pool call."""
    return [verifier(t, reference, fields) for t in texts]


def toggle_format_reward(text: str, mode: str | None) -> float | None:
    """LN §5.1 format reward: 1.0 when the response has the layout its toggle asks for."""
    return None if mode is None else float(parse_reasoning(text, mode).ok)


# ---- per-prompt steps ---------------------------------------------------------------------------

@register_step("decontaminate")
class Decontaminate(Step):
    """Drop prompts sharing an n-gram with an evaluation example BEFORE any teacher request
    (LN testable behaviour 13: no contaminated prompt reaches a teacher)."""

    class Config(_Cfg):
        evals: list[dict[str, Any]]
        n: int = 13
        fields: list[str] = Field(default_factory=lambda: ["prompt"])

    async def apply(self, row: Row) -> None:
        idx = self.env.eval_index(self.cfg.evals, self.cfg.n)
        text = "\n".join(str(row.fields.get(f, "")) for f in self.cfg.fields)
        hit = idx.find(text)
        self.count(row, 1, 0 if hit else 1)
        if hit:
            row.drop(self.name, f"contaminated: {self.cfg.n}-gram overlap with {hit[0]} example {hit[1]}: '{hit[2]}'")


@register_step("generate")
class Generate(Step):
    """n sampled responses per prompt from a teacher, each its own request with its own seed.

    `teacher` is a role name, or a mapping {category: role, default: role} that routes by the
    row's category (LN §3.2: general-domain prompts to the general instruct teacher).
    `mode` sets the reasoning toggle: the teacher gets `system` (default: the toggle literal) and
    records carry the literal `detailed thinking on|off`.
    """

    class Config(_Cfg):
        field: str
        teacher: str | dict[str, str]
        mode: Mode | None = None
        system: str | None = None
        template: str = "{prompt}"
        fewshot: list[dict[str, str]] = Field(default_factory=list)   # [{user, assistant}] shown to the teacher only
        # start of the assistant turn, continued by the teacher (vLLM/SGLang `continue_final_message`);
        # it is part of the response text recorded (e.g. "<think>\n" for a teacher that needs a push)
        prefill: str | None = None
        n: int = 1
        params: dict[str, Any] = Field(default_factory=dict)
        logprobs: bool = False
        top_logprobs: int = 0
        return_token_ids: bool = False
        json_schema: dict[str, Any] | None = None
        # a reply that fails json_schema is asked again this many times, with the error (then rejected)
        json_retries: int = 0

    def role_for(self, row: Row) -> str:
        t = self.cfg.teacher
        if isinstance(t, str):
            return t
        cat = str(row.fields.get("category") or "")
        if cat in t:
            return t[cat]
        if "default" not in t:
            raise ValueError(f"step {self.name}: no teacher for category {cat!r} and no 'default'")
        return t["default"]

    def messages(self, row: Row) -> list[dict[str, Any]]:
        msgs = []
        system = self.cfg.system if self.cfg.system is not None else (TOGGLE[self.cfg.mode] if self.cfg.mode else None)
        if system:
            msgs.append({"role": "system", "content": render(system, row.fields)})
        for shot in self.cfg.fewshot:
            if set(shot) != {"user", "assistant"}:
                raise ValueError(f"step {self.name}: each fewshot item needs exactly `user` and `assistant`")
            msgs += [{"role": "user", "content": shot["user"]}, {"role": "assistant", "content": shot["assistant"]}]
        msgs.append({"role": "user", "content": render(self.cfg.template, row.fields)})
        if self.cfg.prefill:
            msgs.append({"role": "assistant", "content": self.cfg.prefill})
        return msgs

    def params(self) -> dict[str, Any]:
        p = dict(self.cfg.params)
        if self.cfg.prefill:
            p.update(continue_final_message=True, add_generation_prompt=False)
        return p

    async def ask_sample(self, row: Row, role: str, msgs: list[dict[str, Any]], i: int) -> tuple[Any, int, str | None]:
        """Sample i: (result, seed, why it fails json_schema or None); a failing structured reply
        is asked again with the error, up to `json_retries` times."""
        seed = derive_seed(self.env.seed, row.id, self.cfg.field, i)
        kw = dict(logprobs=self.cfg.logprobs, top_logprobs=self.cfg.top_logprobs,
                  return_token_ids=self.cfg.return_token_ids, json_schema=self.cfg.json_schema)
        res = await self.ask(row, role, msgs, params=self.params(), seed=seed, **kw)
        why = None
        for attempt in range(self.cfg.json_retries + 1):
            if self.cfg.json_schema is None:
                break
            try:
                why = await self.check(check_json_schema, res.content, self.cfg.json_schema)
            except CheckTimeout as e:
                why = f"timeout: {e}"
            if why is None or attempt == self.cfg.json_retries:
                break
            again = msgs + [{"role": "assistant", "content": res.content},
                            {"role": "user", "content": f"That reply is not valid: {why}. Reply again with only the JSON."}]
            res = await self.ask(row, role, again, params=self.params(),
                                 seed=derive_seed(self.env.seed, row.id, self.cfg.field, i, "json", attempt), **kw)
        return res, seed, why

    async def apply(self, row: Row) -> None:
        role = self.role_for(row)
        tcfg = self.env.backend(role).cfg
        msgs = self.messages(row)
        samples = await asyncio.gather(*(self.ask_sample(row, role, msgs, i) for i in range(self.cfg.n)))
        cands = row.candidates.setdefault(self.cfg.field, [])
        made = []
        for res, seed, why in samples:
            c = Candidate(
                field=self.cfg.field, index=len(cands), text=(self.cfg.prefill or "") + with_reasoning(res.content, res.reasoning),
                teacher_role=role, mode=self.cfg.mode, result=res, messages=msgs,
                teacher={**self.teacher_info(role, self.cfg.params, seed), "logprobs_mode": tcfg.logprobs_mode,
                         "precision": tcfg.precision, "reasoning_field": res.reasoning_field})
            cands.append(c)
            made.append((c, why))
        schema_problem = {id(c): why for c, why in made}
        await self.keep(row, [c for c, _ in made], lambda c: schema_problem[id(c)] and f"json_schema: {schema_problem[id(c)]}")


@register_step("parse_reasoning")
class ParseReasoning(Step):
    """Check the toggle format (LN testable 1, 23) and split think / final answer."""

    class Config(_Cfg):
        field: str
        mode: Mode | None = None    # default: the mode the candidates were generated in

    async def apply(self, row: Row) -> None:
        def split(c: Candidate) -> str | None:
            mode = self.cfg.mode or c.mode
            if mode is None:
                raise ValueError(f"step {self.name}: field '{self.cfg.field}' has no mode; set mode: on|off")
            parsed = parse_reasoning(c.text, mode)
            c.parsed["think"] = parsed.think
            c.parsed["answer_text"] = parsed.answer
            return None if parsed.ok else parsed.problem

        await self.keep(row, self.cfg.field, split)


@register_step("filter")
class Filter(Step):
    """Rule filters on candidates: truncated (finish_reason=length), length bounds, forbidden
    substrings, a required regex."""

    class Config(_Cfg):
        field: str
        drop_truncated: bool = True
        min_chars: int = 1
        max_chars: int | None = None
        must_not_contain: list[str] = Field(default_factory=list)
        must_match: str | None = None

    def problem(self, c: Candidate, pat: re.Pattern[str] | None) -> str | None:
        if self.cfg.drop_truncated and c.result is not None and c.result.finish_reason == "length":
            return "truncated at max_tokens (finish_reason=length)"
        if len(c.text.strip()) < self.cfg.min_chars:
            return f"shorter than {self.cfg.min_chars} chars"
        if self.cfg.max_chars is not None and len(c.text) > self.cfg.max_chars:
            return f"longer than {self.cfg.max_chars} chars"
        banned = next((s for s in self.cfg.must_not_contain if s in c.text), None)
        if banned is not None:
            return "contains a forbidden substring: " + banned
        if pat is not None and not pat.search(c.text):
            return f"does not match {self.cfg.must_match!r}"
        return None

    async def apply(self, row: Row) -> None:
        pat = re.compile(self.cfg.must_match, re.S) if self.cfg.must_match else None
        await self.keep(row, self.cfg.field, lambda c: self.problem(c, pat))


JUDGE_TEMPLATE = (
    "You are grading an answer.\nQuestion:\n{question}\n\nReference answer:\n{reference}\n\n"
    "Candidate answer:\n{response}\n\nIs the candidate's final answer equivalent to the reference? "
    "Reply with a JSON object {{\"verdict\": true}} or {{\"verdict\": false}}.")
JUDGE_SCHEMA = {"type": "object", "properties": {"verdict": {"type": "boolean"}, "score": {"type": "number"}},
                "required": ["verdict"]}


def parse_judge_verdict(text: str) -> tuple[bool | None, float | None]:
    """A judge's verdict from JSON (`{"verdict": true, "score": 4}`) or plain text
    (True/False, yes/no, `score: N`); (None, None) when unparseable (LN testable 24)."""
    obj = json_reply(text)
    if obj is not None:
        v = obj.get("verdict")
        s = obj.get("score")
        return (bool(v) if isinstance(v, bool) else None), (float(s) if isinstance(s, (int, float)) else None)
    low = text.strip().lower()
    m = re.search(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", low)
    score = float(m.group(1)) if m else None
    if re.match(r"^\W*(true|yes|correct|equivalent)\b", low):
        return True, score
    if re.match(r"^\W*(false|no|incorrect|not equivalent)\b", low):
        return False, score
    return None, score


class JudgeSpec(_Cfg):
    teacher: str
    template: str = JUDGE_TEMPLATE
    constrained: bool = True            # ask for JSON-schema constrained output
    min_score: float | None = None      # reward mode: admit when score >= min_score
    params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 64})


async def judge_candidates(step: Step, row: Row, cands: list[Candidate], spec: JudgeSpec,
                           reference: Any, answer_key: str = "answer_text") -> list[tuple[bool | None, float | None]]:
    async def one(c: Candidate) -> tuple[bool | None, float | None]:
        fields = dict(row.fields, question=row.prompt, reference="" if reference is None else reference,
                      response=c.parsed.get(answer_key) or c.text)
        res = await step.ask(row, spec.teacher, [{"role": "user", "content": render(spec.template, fields)}], c.field, c.index,
                             params=spec.params, json_schema=JUDGE_SCHEMA if spec.constrained else None)
        return parse_judge_verdict(res.content)

    return list(await asyncio.gather(*(one(c) for c in cands)))


# ---- rubric and pass/fail judges (domain generators) --------------------------------------------

SCORE_SCHEMA = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                                                 "reason": {"type": "string"}}, "required": ["score"]}
VERDICT_SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["PASS", "FAIL"]},
                                                   "reason": {"type": "string"}}, "required": ["verdict"]}
_SCORE_RE = re.compile(r"score\W{0,4}(\d+(?:\.\d+)?)", re.IGNORECASE)
_VERDICT_RE = re.compile(r"\b(PASS|FAIL)\b")


def json_reply(text: str) -> dict[str, Any] | None:
    """The JSON object of a judge's reply (`synth.toolcalls.parse_json_object`: a fenced block, or
    the first {...} span), or None when it has none: the one reader of every judge reply."""
    try:
        return parse_json_object(text)
    except ValueError:
        return None


def parse_score(text: str, lo: float = 1, hi: float = 5) -> float | None:
    """A 1-5 score from `{"score": 4}`, `Score: 4` or a reply that is just a number; None otherwise."""
    obj = json_reply(text)
    if obj is not None and isinstance(obj.get("score"), (int, float)) and not isinstance(obj["score"], bool):
        v = float(obj["score"])
        return v if lo <= v <= hi else None
    m = _SCORE_RE.search(text) or re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*", text)
    if m:
        v = float(m.group(1))
        return v if lo <= v <= hi else None
    return None


def parse_pass_fail(text: str) -> bool | None:
    """PASS/FAIL (the last one stated), or JSON {"verdict": "pass"|true}; None when neither."""
    obj = json_reply(text)
    if obj is not None:
        v = obj.get("verdict")
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.upper() in ("PASS", "FAIL"):
            return v.upper() == "PASS"
    found = _VERDICT_RE.findall(text.upper())
    return (found[-1] == "PASS") if found else None


def reply_reason(text: str) -> str:
    """The `reason` of a JSON judge reply (else the reply's start)."""
    obj = json_reply(text)
    return str(obj.get("reason", ""))[:200] if obj is not None else text.strip()[:200]


class RubricCfg(_Cfg):
    """One LLM critic: a named rubric scored 1-5, passing at `min_score`."""

    name: str
    description: str
    min_score: float = 4


class JudgeParams(_Cfg):
    teacher: str = "judge"
    params: dict[str, Any] = Field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 128})
    constrained: bool = True       # ask for JSON-schema constrained output where the server supports it


async def score_rubric(step: Step, row: Row, judge: JudgeParams, rubric: RubricCfg, prompt: str, *key: Any
                       ) -> dict[str, Any]:
    """Ask the judge for one rubric; returns {name, score, pass, reason} (unparseable -> fail)."""
    res = await step.ask(row, judge.teacher, [{"role": "user", "content": prompt}], rubric.name, *key,
                         params=judge.params, json_schema=SCORE_SCHEMA if judge.constrained else None)
    score = parse_score(res.content)
    obj = json_reply(res.content)
    reason = str(obj.get("reason", "")) if obj is not None else res.content.strip()[:200]
    return {"name": rubric.name, "score": score, "pass": score is not None and score >= rubric.min_score,
            "reason": reason if score is not None else f"unparseable judge reply: {res.content.strip()[:120]!r}"}


async def judge_pass_fail(step: Step, row: Row, judge: JudgeParams, prompt: str, *key: Any) -> tuple[bool | None, str]:
    """Ask the judge for PASS/FAIL; (verdict or None when unparseable, its reason)."""
    res = await step.ask(row, judge.teacher, [{"role": "user", "content": prompt}], *key, params=judge.params,
                         json_schema=VERDICT_SCHEMA if judge.constrained else None)
    verdict = parse_pass_fail(res.content)
    return verdict, (reply_reason(res.content) if verdict is not None
                     else f"unparseable judge reply: {res.content.strip()[:120]!r}")


async def judge_candidate(step: Step, row: Row, judge: JudgeParams, prompt: str, c: Candidate, verdict_field: str,
                          label: str, *key: Any) -> str | None:
    """`judge_pass_fail` on candidate `c`: its verdict goes to `c.parsed[verdict_field]` as
    {pass, reason}; returns why to reject it (`"<label>: <reason>"`), or None when it passes."""
    verdict, why = await judge_pass_fail(step, row, judge, prompt, *key)
    c.parsed[verdict_field] = {"pass": bool(verdict), "reason": why}
    return None if verdict else f"{label}: {why}"


@register_step("verify")
class Verify(Step):
    """Verify candidates against the row's reference with a registered verifier (math, mcq,
    exact, ...). Without a reference: `fallback: majority_vote` makes the most common answer over
    the pooled candidates the reference (LN §2.1; `answer_source: majority_vote`), `fallback:
    judge` asks a judge endpoint, `none` drops the prompt."""

    class Config(_Cfg):
        fields: list[str]
        method: str = "math"
        reference_field: str = "reference"
        fallback: Literal["none", "majority_vote", "judge"] = "none"
        vote_fields: list[str] | None = None
        min_votes: int = 2
        judge: JudgeSpec | None = None

    async def apply(self, row: Row) -> None:
        verifier = get_verifier(self.cfg.method)
        ref = row.fields.get(self.cfg.reference_field)
        answer_source = row.fields.get("answer_source") or "reference"
        if ref is None or (isinstance(ref, str) and not ref.strip()):
            if self.cfg.fallback == "majority_vote":
                pool = [c for f in (self.cfg.vote_fields or self.cfg.fields) for c in self.alive(row, f)]
                try:
                    ref, votes = await self.check(vote, self.cfg.method, [c.parsed.get("answer_text") or c.text for c in pool])
                except CheckTimeout:
                    ref, votes = None, 0
                if ref is None or votes < self.cfg.min_votes:
                    self.count(row, len(pool), 0)
                    row.drop(self.name, f"no reference and no majority answer (best has {votes} votes, "
                                        f"need {self.cfg.min_votes})")
                    return
                row.fields[self.cfg.reference_field] = ref
                row.fields["answer_source"] = answer_source = "majority_vote"
                row.fields["majority_votes"] = votes
            elif self.cfg.fallback == "judge":
                await self._judge_all(row, None)
                return
            else:
                n = sum(len(self.alive(row, f)) for f in self.cfg.fields)
                self.count(row, n, 0)
                row.drop(self.name, f"no reference answer in field '{self.cfg.reference_field}'")
                return
        else:
            row.fields.setdefault("answer_source", "reference")
        cands = [c for f in self.cfg.fields for c in self.alive(row, f)]
        texts = [c.parsed.get("answer_text") or c.text for c in cands]
        try:                                    # one round trip to the check pool per prompt
            outs: list[Any] | None = await self.check(verify_each, verifier, texts, ref, row.fields)
        except CheckTimeout:
            outs = None                         # one of them hangs: each on its own, under its own limit
        by_cand = {id(c): i for i, c in enumerate(cands)}

        async def verdict(c: Candidate) -> str | None:
            try:
                out = outs[by_cand[id(c)]] if outs is not None else await self.check(verifier, texts[by_cand[id(c)]],
                                                                                       ref, row.fields)
            except CheckTimeout as e:           # counted like any rejection
                c.verification = Verification(method=self.cfg.method, verdict=False, score=0.0, rule=answer_source,
                                              detail=f"timeout: {e}")
                return f"verifier timeout: {e}"
            c.parsed["extracted"] = out.extracted
            c.verification = Verification(method=self.cfg.method, verdict=out.passed, score=out.score,
                                          rule=answer_source, detail=out.detail or None)
            return None if out.passed else (out.detail or "wrong answer")

        await self.keep(row, cands, verdict)

    async def _judge_all(self, row: Row, ref: Any) -> None:
        if self.cfg.judge is None:
            raise ValueError(f"step {self.name}: fallback judge needs a `judge:` spec")
        await Judge.judge_fields(self, row, self.cfg.fields, self.cfg.judge, ref)


@register_step("judge")
class Judge(Step):
    """Ask a judge (or reward) endpoint about each candidate: binary verdict, or a score with
    `min_score` (rejection sampling with a reward model, LN §2.4)."""

    class Config(JudgeSpec):
        fields: list[str]
        reference_field: str = "reference"

    async def apply(self, row: Row) -> None:
        await self.judge_fields(self, row, self.cfg.fields, self.cfg, row.fields.get(self.cfg.reference_field))

    @staticmethod
    async def judge_fields(step: Step, row: Row, fields: list[str], spec: JudgeSpec, ref: Any) -> None:
        cands = [c for f in fields for c in step.alive(row, f)]
        verdicts = await judge_candidates(step, row, cands, spec, ref)
        model = step.env.backend(spec.teacher).cfg.model
        found = dict(zip(map(id, cands), verdicts))

        def admit(c: Candidate) -> str | None:
            verdict, score = found[id(c)]
            if spec.min_score is not None:
                ok = score is not None and score >= spec.min_score
                rule = f"reward>={spec.min_score:g}:{model}"
            else:
                ok = bool(verdict)
                rule = f"judge:{model}"
            c.verification = Verification(method="reward" if spec.min_score is not None else "judge", verdict=ok,
                                          score=score, rule=rule,
                                          detail=None if verdict is not None or score is not None else "unparseable judge reply")
            if ok:
                return None
            return "judge: unparseable reply" if (verdict is None and score is None) else "judge said no"

        await step.keep(row, cands, admit)
        row.fields.setdefault("answer_source", "judge")


def sft_record(step: Step, row: Row, c: Candidate, pair_id: str | None = None, pair_role: str | None = None) -> SynthRecord:
    gen = step.env.generator
    msgs = []
    if c.mode:
        msgs.append(Message(role="system", content=TOGGLE[c.mode]))
    msgs.append(Message(role="user", content=row.prompt))
    msgs.append(Message(role="assistant", content=c.text.strip()))
    t = {k: v for k, v in c.teacher.items() if k in TeacherInfo.model_fields}
    return SynthRecord(
        id=stable_id(gen.generator, row.id, c.field, c.index, pair_role or "single"),
        kind="sft", generator=gen.generator, prompt_id=row.id, source=str(row.fields.get("source") or ""),
        category=str(row.fields.get("category") or gen.category), license=gen.license,
        messages=msgs, system=TOGGLE[c.mode] if c.mode else None, reasoning=c.mode,  # type: ignore[arg-type]
        pair_id=pair_id, pair_role=pair_role, teacher=TeacherInfo(**t), verification=c.verification,  # type: ignore[arg-type]
        answer_source=row.fields.get("answer_source"),
        meta={"reference": row.fields.get("reference"), "finish_reason": c.result.finish_reason if c.result else None})


@register_step("pair")
class Pair(Step):
    """Llama-Nemotron §3.2 toggle pairs: when both modes have a verified response, one strict pair
    (same `pair_id`, `pair_role` on/off: the first passing sample of each side); the other passing
    samples become mode-specific bulk records (no pair_id), as LN's math off-mode data is."""

    class Config(_Cfg):
        on_field: str = "reasoning"
        off_field: str = "direct"
        bulk_on: bool = False
        bulk_off: bool = True
        max_bulk_per_prompt: int | None = None

    async def apply(self, row: Row) -> None:
        on, off = self.alive(row, self.cfg.on_field), self.alive(row, self.cfg.off_field)
        n_in = len(on) + len(off)
        out: list[SynthRecord] = []
        used: set[int] = set()
        if on and off:
            pid = stable_id(self.env.generator.generator, row.id, "pair")
            out += [sft_record(self, row, on[0], pid, "on"), sft_record(self, row, off[0], pid, "off")]
            used = {id(on[0]), id(off[0])}
        bulk = [c for c in (on if self.cfg.bulk_on else []) + (off if self.cfg.bulk_off else []) if id(c) not in used]
        if self.cfg.max_bulk_per_prompt is not None:
            bulk = bulk[: self.cfg.max_bulk_per_prompt]
        out += [sft_record(self, row, c) for c in bulk]
        row.records += out
        row.fields["strict_pair"] = bool(on and off)
        self.count(row, n_in, len(out))


@register_step("format_sft")
class FormatSft(Step):
    """One SFT record per surviving candidate of `field` (single-mode generators)."""

    class Config(_Cfg):
        field: str
        max_per_prompt: int | None = None

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, self.cfg.field)
        keep = alive[: self.cfg.max_per_prompt] if self.cfg.max_per_prompt is not None else alive
        row.records += [sft_record(self, row, c) for c in keep]
        self.count(row, len(alive), len(keep))


@register_step("pass_rate")
class PassRate(Step):
    """Pass rate over the k samples of `field` (every sample counts: one rejected for format or
    truncation is a failure), then LN §6.1's difficulty filter."""

    class Config(_Cfg):
        field: str
        max_pass_rate: float = 0.75
        min_pass_rate: float | None = None
        drop_never_solved: bool = False

    async def apply(self, row: Row) -> None:
        cands = row.candidates.get(self.cfg.field, [])
        if not cands:
            raise ValueError(f"step {self.name}: no samples in field '{self.cfg.field}' (generate them first)")
        verdicts = [c.alive and c.verification is not None and c.verification.verdict for c in cands]
        rate = rl.pass_rate(verdicts)
        row.fields["pass_rate"] = rate
        row.fields["n_samples"] = len(cands)
        row.fields["estimator"] = cands[0].teacher.get("model", "")
        why = rl.difficulty_filter(rate, self.cfg.max_pass_rate, self.cfg.min_pass_rate, self.cfg.drop_never_solved)
        self.count(row, 1, 0 if why else 1)
        if why:
            row.drop(self.name, why)


@register_step("format_rl")
class FormatRl(Step):
    """An `rl_prompt` record (prompt, reference, verifier, pass rate, estimator) and, with
    `rollouts: true`, one `rl_rollout` record per sample with token ids, logprobs and provenance."""

    class Config(_Cfg):
        field: str
        verifier: str = "math"
        rollouts: bool = True
        max_context: int | None = None

    async def apply(self, row: Row) -> None:
        gen = self.env.generator
        cands = row.candidates.get(self.cfg.field, [])
        sent = next((c.messages for c in cands if c.messages), None) or [{"role": "user", "content": row.prompt}]
        common = dict(generator=gen.generator, prompt_id=row.id, source=str(row.fields.get("source") or ""),
                      category=str(row.fields.get("category") or gen.category), license=gen.license,
                      prompt=row.prompt, reference=None if row.fields.get("reference") is None else str(row.fields["reference"]),
                      verifier=self.cfg.verifier, pass_rate=row.fields.get("pass_rate"),
                      n_samples=row.fields.get("n_samples"), estimator=row.fields.get("estimator"),
                      answer_source=row.fields.get("answer_source"))
        # the prompt exactly as the policy was sampled on: system (toggle) prompt, few-shot, template, prefill
        out = [SynthRecord(id=stable_id(gen.generator, row.id, "rl_prompt"), kind="rl_prompt",
                           messages=[Message(**m) for m in sent], **common)]
        if self.cfg.rollouts:
            for c in cands:
                if c.result is None:
                    continue
                passed = bool(c.alive and c.verification is not None and c.verification.verdict)
                served = await self.env.endpoint_info(c.teacher_role)
                ro = rl.rollout_fields(c.result, c.teacher, {"temperature": c.teacher.get("temperature"),
                                                             "top_p": c.teacher.get("top_p"), "top_k": c.teacher.get("top_k")},
                                       c.teacher.get("seed"), self.cfg.max_context, served=served)
                ro["format_reward"] = toggle_format_reward(c.text, c.mode)
                msgs = c.messages or sent
                if msgs and msgs[-1]["role"] == "assistant":      # a prefill: the sample continues that turn
                    msgs = msgs[:-1]
                t = {k: v for k, v in c.teacher.items() if k in TeacherInfo.model_fields}
                out.append(SynthRecord(
                    id=stable_id(gen.generator, row.id, c.field, c.index, "rollout"), kind="rl_rollout", **common,
                    messages=[Message(**m) for m in msgs] + [Message(role="assistant", content=c.text)],
                    teacher=TeacherInfo(**t), verification=c.verification, reward=1.0 if passed else 0.0,
                    rollout=Rollout(**ro), meta={"rejected_by": c.reason or None}))
        row.records += out
        self.count(row, len(cands), len(out))


# ---- dataset-level steps ------------------------------------------------------------------------

@register_post_step("clean")
class Clean(PostStep):
    """Empty conversations, exact duplicates, and n-gram overlap with evaluation sets."""

    class Config(_Cfg):
        evals: list[dict[str, Any]] = Field(default_factory=list)
        n: int = 13
        roles: list[str] = Field(default_factory=lambda: ["user", "assistant"])
        drop_duplicates: bool = True
        drop_empty: bool = True

    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        idx = self.env.eval_index(self.cfg.evals, self.cfg.n) if self.cfg.evals else None
        kept, removals = clean_records(records, idx, tuple(self.cfg.roles), self.cfg.drop_duplicates, self.cfg.drop_empty)
        # a removed half of a strict pair takes the other half with it (pairs appear exactly twice)
        gone_pairs = {r.pair_id for r in records if r.pair_id and r.id in {x["id"] for x in removals}}
        if gone_pairs:
            orphan = [r for r in kept if r.pair_id in gone_pairs]
            removals += [{"id": r.id, "prompt_id": r.prompt_id, "reason": "pair_partner_removed", "pair_id": r.pair_id}
                         for r in orphan]
            kept = [r for r in kept if r.pair_id not in gone_pairs]
        for r in removals:
            r["step"] = self.name
        self.summary = removal_summary(removals)
        return kept, removals


@register_post_step("curriculum")
class Curriculum(PostStep):
    """Order `rl_prompt` records easy -> hard, or in LN §6.2 Gaussian-target batches; each gets
    `curriculum_rank` (and `meta.batch`). Rollouts follow their prompt's order."""

    class Config(_Cfg):
        order: Literal["easy_to_hard", "gaussian_batches"] = "easy_to_hard"
        batch_size: int = 64
        sigma: float = 0.15
        mu_start: float | None = None
        mu_end: float | None = None
        seed: int | None = None

    def apply(self, records: list[SynthRecord]) -> tuple[list[SynthRecord], list[dict[str, Any]]]:
        seed = self.env.seed if self.cfg.seed is None else self.cfg.seed
        prompts = [r for r in records if r.kind == "rl_prompt"]
        items = [(r.prompt_id, float(r.pass_rate or 0.0)) for r in prompts]
        batch_of: dict[str, int] = {}
        if self.cfg.order == "easy_to_hard":
            order = rl.order_easy_to_hard(items, seed)
        else:
            batches = rl.gaussian_curriculum_batches(items, self.cfg.batch_size, self.cfg.sigma,
                                                     self.cfg.mu_start, self.cfg.mu_end, seed)
            order = [i for b in batches for i in b]
            batch_of = {i: bi for bi, b in enumerate(batches) for i in b}
        rank = {pid: k for k, pid in enumerate(order)}
        out: list[SynthRecord] = []
        by_prompt: dict[str, list[SynthRecord]] = {}
        for r in records:
            by_prompt.setdefault(r.prompt_id, []).append(r)
        for pid in order:
            for r in by_prompt.pop(pid, []):
                r = r.model_copy(update={"curriculum_rank": rank[pid],
                                         "meta": dict(r.meta, **({"batch": batch_of[pid]} if pid in batch_of else {}))})
                out.append(r)
        for rest in by_prompt.values():        # non-RL records keep their order, after the curriculum
            out += rest
        self.summary = {"order": self.cfg.order, "n_prompts": len(order)}
        return out, []
