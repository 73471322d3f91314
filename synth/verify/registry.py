"""The verifier registry: `@register_verifier("name")` for `fn(response, reference, row) -> Outcome`,
and the built-in verifiers `math`, `mcq` and `exact` (domain generators add their own, such as
`sql_exec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from synth.verify.choice import extract_choice_letter
from synth.verify.math_grader import (asks_for_all_solutions, canonical_math_key, committed_answer, extract_final_answer,
                                      math_equivalent, normalize_answer)

# ---- registry -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    passed: bool
    score: float | None = None
    detail: str = ""
    extracted: str | None = None


Verifier = Callable[[str, Any, dict[str, Any]], Outcome]
VERIFIERS: dict[str, Verifier] = {}


def register_verifier(name: str) -> Callable[[Verifier], Verifier]:
    """Register `fn(response_text, reference, row_fields) -> Outcome` under `name`."""
    def deco(fn: Verifier) -> Verifier:
        if name in VERIFIERS and VERIFIERS[name] is not fn:
            raise ValueError(f"verifier {name!r} is already registered")
        VERIFIERS[name] = fn
        return fn
    return deco


def get_verifier(name: str) -> Verifier:
    if name not in VERIFIERS:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(sorted(VERIFIERS))}")
    return VERIFIERS[name]


def _question(row: dict[str, Any]) -> str | None:
    for k in ("question", "problem", "prompt"):
        if isinstance(row.get(k), str):
            return row[k]
    return None


@register_verifier("math")
def verify_math(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    """The committed final answer (`committed_answer`: hedges and unrelated multiple answers
    rejected) against the reference (`math_equivalent`, unordered when the row's question asks
    for all solutions)."""
    ans, problem = committed_answer(response)
    if ans is None:
        return Outcome(False, 0.0, problem, None)
    ok = math_equivalent(ans, None if reference is None else str(reference),
                         unordered=asks_for_all_solutions(_question(row or {})))
    return Outcome(ok, 1.0 if ok else 0.0, "" if ok else f"answer {ans!r} != reference {reference!r}", ans)


@register_verifier("mcq")
def verify_mcq(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    letter = extract_choice_letter(response)
    ref = str(reference).strip().strip("()").upper() if reference is not None else None
    if letter is None:
        return Outcome(False, 0.0, "no choice letter found", None)
    ok = letter == ref
    return Outcome(ok, 1.0 if ok else 0.0, "" if ok else f"chose {letter}, key is {ref}", letter)


@register_verifier("exact")
def verify_exact(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    ans = extract_final_answer(response) or response
    ok = reference is not None and normalize_answer(ans) == normalize_answer(str(reference))
    return Outcome(ok, 1.0 if ok else 0.0, "" if ok else f"{ans!r} != {reference!r}", ans)


ANSWER_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "math": extract_final_answer, "mcq": extract_choice_letter, "exact": extract_final_answer}
ANSWER_KEYS: dict[str, Callable[[str | None], str | None]] = {
    "math": canonical_math_key,
    "mcq": lambda a: a.upper() if a else None,
    "exact": lambda a: normalize_answer(a) if a else None,
}
