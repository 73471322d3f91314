"""Answer extraction and matching for generative math tasks (GSM8K / MATH style).

Puro §4.1.2's postprocessor, as the spec summarizes it: prefer explicit final-answer markers and
boxed answers, keep signs and fractions, and fall back to the final numeric expression. Numbers are
compared exactly as fractions (`1.50` == `3/2` == `\\frac{3}{2}`); anything else is compared as
normalized text.
"""

from __future__ import annotations

import re
import string
from fractions import Fraction
from typing import Sequence

# "The answer is 12", "Final answer: -3/4", "#### 1,000", "Answer: $5"
_MARKERS = [
    re.compile(r"####\s*(?P<a>[^\n]+)"),
    re.compile(r"(?i)final\s+answer\s*(?:is|:)?\s*[:=]?\s*(?P<a>[^\n]+)"),
    re.compile(r"(?i)the\s+(?:final\s+)?answer\s+is\s*[:=]?\s*(?P<a>[^\n]+)"),
    re.compile(r"(?i)(?:^|\n)\s*answer\s*[:=]\s*(?P<a>[^\n]+)"),
]
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212]?)\s?\$?\s?(?P<num>\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s?/\s?(?P<den>\d[\d,]*(?:\.\d+)?))?(?P<pct>\s?%)?"
)
_FRAC = re.compile(r"(?P<sign>[-+\u2212]?)\s*\\[dt]?frac\s*\{\s*(?P<n>[^{}]+?)\s*\}\s*\{\s*(?P<d>[^{}]+?)\s*\}")
_FRAC_SHORT = re.compile(r"(?P<sign>[-+\u2212]?)\s*\\[dt]?frac\s*(?P<n>\d)(?P<d>\d)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), with nested braces balanced."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        m = re.match(r"\\boxed\s+(\S+)", text[idx:])   # "\boxed 5"
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def _clean_latex(s: str) -> str:
    s = s.replace("\u2212", "-").replace("\\!", "").replace("{,}", ",").replace("\\,", "").replace("\\$", "$")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\%", "%")
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mbox\{([^{}]*)\}", r"\1", s)
    s = _FRAC.sub(lambda m: f"{m.group('sign')}({m.group('n')})/({m.group('d')})", s)
    s = _FRAC_SHORT.sub(lambda m: f"{m.group('sign')}{m.group('n')}/{m.group('d')}", s)
    return s


def parse_number(s: str) -> Fraction | None:
    """The value of a string that is one number: `-1,234.5`, `3/4`, `\\frac{-3}{4}`, `$5`, `50%` (0.5 is
    not assumed: a percent stays 50). Returns None when the string is not a single number."""
    s = _clean_latex(s).strip().rstrip(".").strip()
    s = re.sub(r"^\$|\$$", "", s).strip()
    s = re.sub(r"\s*(dollars?|cents?|units?|%)$", "", s, flags=re.I).strip()
    m = re.fullmatch(r"(?P<sign>[-+]?)\s*\(?\s*(?P<n>[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+)\s*\)?"
                     r"(?:\s*/\s*\(?\s*(?P<d>[-+]?\d[\d,]*(?:\.\d+)?)\s*\)?)?", s)
    if not m:
        return None
    try:
        value = Fraction(m.group("n").replace(",", ""))
        if m.group("d"):
            den = Fraction(m.group("d").replace(",", ""))
            if den == 0:
                return None
            value /= den
    except (ValueError, ZeroDivisionError):
        return None
    return -value if m.group("sign") == "-" else value


def numbers_in(text: str) -> list[str]:
    """Every numeric expression in `text`, in order (signs and fractions kept, thousands separators
    removed)."""
    text = _clean_latex(text)
    out = []
    for m in _NUMBER.finditer(text):
        sign = "-" if m.group("sign") in ("-", "\u2212") else ""
        num = m.group("num").replace(",", "")
        den = (m.group("den") or "").replace(",", "")
        out.append(f"{sign}{num}/{den}" if den else f"{sign}{num}")
    return out


def extract_answer(text: str) -> str | None:
    """The final answer a model wrote: last `\\boxed{}`, else the last final-answer marker (its first
    number, or its text), else the last number in the text. None when there is nothing."""
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    best: tuple[int, str] | None = None
    for pat in _MARKERS:
        for m in pat.finditer(text):
            if best is None or m.start() > best[0]:
                best = (m.start(), m.group("a"))
    if best is not None:
        content = best[1].strip()
        inner = last_boxed(content)
        if inner is not None:
            return inner.strip()
        nums = numbers_in(content)
        if nums:
            return nums[0]
        content = content.rstrip(".").strip()
        if content:
            return content
    nums = numbers_in(text)
    return nums[-1] if nums else None


def gsm8k_gold(answer_field: str) -> str:
    """GSM8K's reference: the text after `####`."""
    if "####" in answer_field:
        return answer_field.split("####")[-1].strip()
    got = extract_answer(answer_field)
    return got if got is not None else answer_field.strip()


def normalize_text_answer(s: str) -> str:
    s = _clean_latex(s).lower().strip()
    s = re.sub(r"^\$+|\$+$", "", s)
    s = re.sub(r"\s+", "", s)
    return s.rstrip(".")


def answers_match(predicted: str | None, gold: str) -> bool:
    """Exact match after normalization: numbers compare as exact fractions, the rest as text."""
    if predicted is None:
        return False
    p, g = parse_number(predicted), parse_number(gold)
    if p is not None and g is not None:
        return p == g
    if p is None and g is not None:
        nums = numbers_in(predicted)
        if len(nums) == 1:
            q = parse_number(nums[0])
            return q is not None and q == g
    return normalize_text_answer(predicted) == normalize_text_answer(gold)


# ---- lm-evaluation-harness filters and exact_match -------------------------------------------

def regex_first(text: str, pattern: str) -> str:
    """lm-eval's `regex` + `take_first` filter: the first match's group (stripped), or
    "[invalid]"; an empty pattern is the `take_first` filter alone (the whole generation)."""
    if not pattern:
        return text
    found = re.findall(pattern, text)
    if not found:
        return "[invalid]"
    m = found[0]
    if isinstance(m, tuple):
        m = next((x for x in m if x), "")
    return m.strip()


def harness_exact_match(predicted: str, gold: str, regexes_to_ignore: Sequence[str] = (), ignore_case: bool = False,
                        ignore_punctuation: bool = False) -> bool:
    """lm-eval's `exact_match` metric (`exact_match_hf_evaluate`) for one item."""
    p, g = predicted, gold
    for r in regexes_to_ignore:
        p, g = re.sub(r, "", p), re.sub(r, "", g)
    if ignore_case:
        p, g = p.lower(), g.lower()
    if ignore_punctuation:
        table = str.maketrans("", "", string.punctuation)
        p, g = p.translate(table), g.translate(table)
    return p == g
