"""Verifiers: pure functions that decide whether a response is right, and a registry so domain
generators add their own (`@register_verifier("sql_exec")`).

- Reasoning-toggle format (Llama-Nemotron §3.2, §5.1 format reward; LN testable behaviour 23):
  on-mode needs exactly one `<think>`...`</think>` pair, in order, with a non-empty final answer
  after it; off-mode needs neither tag.
- Math answers (LN §2.1 keeps solutions that reach the expected answer): the final answer is
  taken from the last `\\boxed{}` (else "answer is X", "#### X", the last number), normalized
  (LaTeX wrappers, thousands separators, units of `\\text{}`), then compared as strings, as
  numbers, and as sympy expressions (`simplify(a - b) == 0`), with a size guard so a hostile
  expression cannot hang the run.
- Multiple choice: the chosen letter.
- Majority vote (LN §2.1, §2.3 fallback when no reference exists): the most common answer over
  the samples, grouped by equivalence, ties broken by first appearance in sample order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


# ---- reasoning toggle format ------------------------------------------------------------------

@dataclass(frozen=True)
class ReasoningParse:
    think: str | None       # the text inside the one think block (None when absent or malformed)
    answer: str             # what follows </think> (on-mode) or the whole response (off-mode)
    ok: bool
    problem: str            # why not ok ("" when ok)


def parse_reasoning(text: str, mode: str) -> ReasoningParse:
    """Split and check a response for the `detailed thinking on|off` toggle."""
    n_open, n_close = text.count(THINK_OPEN), text.count(THINK_CLOSE)
    if mode == "off":
        if n_open or n_close:
            return ReasoningParse(None, text.strip(), False, "off-mode response contains think tags")
        if not text.strip():
            return ReasoningParse(None, "", False, "empty response")
        return ReasoningParse(None, text.strip(), True, "")
    if mode != "on":
        raise ValueError(f"mode must be 'on' or 'off', not {mode!r}")
    if n_open != 1 or n_close != 1:
        what = "missing" if (n_open == 0 or n_close == 0) else "repeated or nested"
        return ReasoningParse(None, text.strip(), False,
                              f"on-mode needs exactly one <think>...</think> block ({what}: {n_open} open, {n_close} close)")
    i, j = text.index(THINK_OPEN), text.index(THINK_CLOSE)
    if j < i:
        return ReasoningParse(None, text.strip(), False, "</think> comes before <think>")
    if text[:i].strip():
        return ReasoningParse(None, text.strip(), False, "text before <think>")
    think = text[i + len(THINK_OPEN): j].strip()
    answer = text[j + len(THINK_CLOSE):].strip()
    if not think:
        return ReasoningParse(None, answer, False, "empty think block")
    if not answer:
        return ReasoningParse(think, "", False, "no final answer after </think>")
    return ReasoningParse(think, answer, True, "")


# ---- final answers ------------------------------------------------------------------------------

def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    j = i
    while j < len(text) and depth:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
        j += 1
    return text[i: j - 1].strip() if depth == 0 else None


_NUMBER = r"-?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?%?"
_ANSWER_IS = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*:?\s*\$?([^\n$]+?)\$?\s*(?:\.\s|\.$|$|\n)", re.I)


def extract_final_answer(text: str) -> str | None:
    """The final answer a response commits to, or None when it commits to none."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    m = re.search(r"####\s*([^\n]+)", text)
    if m:
        return m.group(1).strip()
    found = _ANSWER_IS.findall(text)
    if found:
        return found[-1].strip()
    nums = re.findall(_NUMBER, text)
    return nums[-1] if nums else None


def normalize_answer(s: str) -> str:
    """Strip presentation: $...$, \\text{...}, \\left/\\right, \\dfrac, spaces, thousands
    separators, a trailing period, degree signs; lower-case."""
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|mathbf|textbf)\{([^}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("^\\circ", "").replace("°", "")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    s = s.rstrip(".").strip()
    s = re.sub(r"\s+", "", s)
    return s.lower()


_UNIT_WORDS = re.compile(r"(?<=\d)(?:[a-z]{2,})$")   # "12apples" -> 12; a lone "3x" stays an expression


def _to_number(s: str) -> Fraction | None:
    t = s.replace("$", "").replace("\\%", "%")
    pct = t.endswith("%")
    t = t.rstrip("%")
    t = _UNIT_WORDS.sub("", t)
    m = re.fullmatch(r"-?\d+(?:\.\d+)?", t) or re.fullmatch(r"-?\d+/\d+", t)
    if not m:
        m2 = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", t)
        if not m2:
            return None
        t = f"{m2.group(1)}/{m2.group(2)}"
    try:
        v = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None
    return v / 100 if pct else v


def latex_to_sympy_text(s: str) -> str:
    """A small LaTeX -> sympy-syntax rewrite for the shapes final answers take."""
    t = s
    for _ in range(5):
        t2 = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", t)
        t2 = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", t2)
        if t2 == t:
            break
        t = t2
    t = t.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("^", "**")
    t = t.replace("{", "(").replace("}", ")").replace("\\", "")
    return t


MAX_SYMPY_CHARS = 120


def _sympy_expr(s: str) -> Any:
    if len(s) > MAX_SYMPY_CHARS or not re.fullmatch(r"[0-9a-z+\-*/().,\s]*", s):
        return None
    from sympy.parsing.sympy_parser import (convert_xor, implicit_multiplication_application,
                                            parse_expr, standard_transformations)
    try:
        return parse_expr(s, transformations=standard_transformations + (implicit_multiplication_application, convert_xor),
                          evaluate=True)
    except Exception:
        return None


def math_equivalent(pred: str | None, ref: str | None) -> bool:
    """True when `pred` and `ref` denote the same answer (string, number or sympy expression)."""
    if pred is None or ref is None:
        return False
    a, b = normalize_answer(pred), normalize_answer(ref)
    if not a or not b:
        return False
    if a == b:
        return True
    na, nb = _to_number(a), _to_number(b)
    if na is not None and nb is not None:
        return na == nb or abs(float(na) - float(nb)) <= 1e-6 * max(1.0, abs(float(nb)))
    # tuples / sets of answers: compare element-wise
    if a[:1] in "([" and b[:1] in "([" and "," in a and "," in b:
        pa, pb = a[1:-1].split(","), b[1:-1].split(",")
        return len(pa) == len(pb) and all(math_equivalent(x, y) for x, y in zip(pa, pb))
    ea, eb = _sympy_expr(latex_to_sympy_text(a)), _sympy_expr(latex_to_sympy_text(b))
    if ea is None or eb is None:
        return False
    try:
        import sympy
        diff = sympy.simplify(ea - eb)
        return bool(diff == 0)
    except Exception:
        return False


def canonical_math_key(ans: str | None) -> str | None:
    """A grouping key under which equivalent answers collide (for majority vote)."""
    if ans is None:
        return None
    a = normalize_answer(ans)
    if not a:
        return None
    n = _to_number(a)
    if n is not None:
        return f"num:{n}"
    e = _sympy_expr(latex_to_sympy_text(a))
    if e is not None:
        try:
            import sympy
            return "expr:" + sympy.srepr(sympy.simplify(e))
        except Exception:
            pass
    return "str:" + a


# ---- multiple choice ----------------------------------------------------------------------------

_MC = [re.compile(p, re.I) for p in (
    r"\\boxed\{\s*\(?([A-J])\)?\s*\}",
    r"answer\s*(?:is|:)\s*\(?([A-J])\)?\b",
    r"^\s*\(?([A-J])\)?\s*$",
    r"\(([A-J])\)",
)]


def extract_choice_letter(text: str) -> str | None:
    for pat in _MC:
        found = pat.findall(text)
        if found:
            return found[-1].upper()
    return None


# ---- majority vote ------------------------------------------------------------------------------

def majority_answer(answers: list[str | None], key: Callable[[str | None], str | None] = canonical_math_key
                    ) -> tuple[str | None, int]:
    """(answer, votes): the most common answer by `key`, ties broken by first appearance.
    Returns the first raw answer of the winning group, so the stored reference is a real sample."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    for i, ans in enumerate(answers):
        k = key(ans)
        if k is None:
            continue
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, (i, ans))  # type: ignore[arg-type]
    if not counts:
        return None, 0
    best = max(counts, key=lambda k: (counts[k], -first[k][0]))
    return first[best][1], counts[best]


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


@register_verifier("math")
def verify_math(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    ans = extract_final_answer(response)
    if ans is None:
        return Outcome(False, 0.0, "no final answer found", None)
    ok = math_equivalent(ans, None if reference is None else str(reference))
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
