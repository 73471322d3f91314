"""Verifiers: pure functions that decide whether a response is right, and a registry so domain
generators add their own (`@register_verifier("sql_exec")`).

- `format`: the reasoning-toggle format (one `<think>`...`</think>` pair in on-mode, none in
  off-mode), the text after the thinking, structured output against a JSON schema.
- `math_grader`: the committed final answer and its equivalence with a reference; majority vote.
- `choice`: the multiple-choice letter of the last explicit answer statement.
- `registry`: `Outcome`, `register_verifier` / `get_verifier`, the built-in `math`, `mcq`, `exact`.

Everything is importable from `synth.verify` as before the split.
"""

from synth.verify.choice import choice_statements, extract_choice_letter
from synth.verify.format import (THINK_CLOSE, THINK_OPEN, ReasoningParse, after_thinking, check_json_schema,
                                 parse_reasoning)
from synth.verify.math_grader import (MAX_ANSWER_CHARS, MAX_EXPR_CHARS, Answer, Many, Scalar, answers_equal,
                                      asks_for_all_solutions, boxed_spans, canonical_math_key, clean_latex,
                                      committed_answer, expressions_equal, extract_final_answer, last_boxed,
                                      majority_answer, math_equivalent, normalize_answer, parse_answer,
                                      parse_expression)
from synth.verify.registry import (ANSWER_EXTRACTORS, ANSWER_KEYS, VERIFIERS, Outcome, Verifier, get_verifier,
                                   register_verifier, verify_exact, verify_math, verify_mcq)

__all__ = [
    "ANSWER_EXTRACTORS", "ANSWER_KEYS", "MAX_ANSWER_CHARS", "MAX_EXPR_CHARS", "THINK_CLOSE", "THINK_OPEN", "VERIFIERS",
    "Answer", "Many", "Outcome", "ReasoningParse", "Scalar", "Verifier", "after_thinking", "answers_equal",
    "asks_for_all_solutions", "boxed_spans", "canonical_math_key", "check_json_schema", "choice_statements",
    "clean_latex", "committed_answer", "expressions_equal", "extract_choice_letter", "extract_final_answer",
    "get_verifier", "last_boxed", "majority_answer", "math_equivalent", "normalize_answer", "parse_answer",
    "parse_expression", "parse_reasoning", "register_verifier", "verify_exact", "verify_math", "verify_mcq",
]
