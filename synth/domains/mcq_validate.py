"""Validators for MMLU-style multiple-choice questions with reasoning traces (Nemotron 3 Super
§2.3.6; spec §1.7 and testable behaviour 7).

- `parse_mcq`: a generated question in the fixed layout (`Question:`, one line per option
  `A) ...`, `Answer: X`).
- `mcq_problems`: the look-alike keeps the seed's option count, has distinct options, a key among
  its letters, and is not the seed question itself.
- `parse_choice`: the letter of a solution's last explicit answer statement (`Answer: X`,
  `\\boxed{X}`, "the answer is (X)", "actually B"), by position.
- `strict_majority`: the answer more than half of *all* samples chose (an unparsable sample counts
  against every answer), or None; questions without one emit nothing.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from synth.verify import extract_choice_letter

_OPTION_RE = re.compile(r"^\s*\(?([A-J])\s*[).:]\s+(.+?)\s*$")
_QUESTION_RE = re.compile(r"^\s*\**question\**\s*[:.]\s*(.*)$", re.IGNORECASE)
_KEY_RE = re.compile(r"^\s*\**(?:correct\s+)?answer\**\s*[:=]\s*\**\s*\(?([A-J])\)?\**\b", re.IGNORECASE)


@dataclass
class Mcq:
    question: str
    options: dict[str, str]
    answer: str

    def render(self) -> str:
        """The question as a solver sees it (no key)."""
        return self.question + "\n" + "\n".join(f"{k}) {v}" for k, v in self.options.items())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def letters(n_options: int) -> list[str]:
    return list(string.ascii_uppercase[:n_options])


def parse_mcq(text: str) -> Mcq:
    """Parse `Question: ...` (possibly several lines), options `A) ...` in order, `Answer: X`.
    Raises ValueError(reason)."""
    q_lines: list[str] = []
    options: dict[str, str] = {}
    answer = None
    in_question = False
    for line in text.splitlines():
        if (m := _KEY_RE.match(line)) and options:
            answer = m.group(1).upper()
            break
        if (m := _OPTION_RE.match(line)) and (q_lines or options):
            options[m.group(1).upper()] = m.group(2)
            in_question = False
            continue
        if (m := _QUESTION_RE.match(line)) and not options:
            in_question = True
            if m.group(1).strip():
                q_lines.append(m.group(1).strip())
            continue
        if in_question and line.strip():
            q_lines.append(line.strip())
    question = " ".join(q_lines).strip()
    if not question:
        raise ValueError("no 'Question:' text")
    if len(options) < 2:
        raise ValueError(f"{len(options)} options found, need at least 2 ('A) ...' lines)")
    if list(options) != letters(len(options)):
        raise ValueError(f"options are lettered {''.join(options)}, expected {''.join(letters(len(options)))}")
    if answer is None:
        raise ValueError("no 'Answer: X' key")
    return Mcq(question, options, answer)


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", s.lower()).split())


def mcq_problems(mcq: Mcq, n_options: int, seed_question: str | None = None) -> list[str]:
    problems = []
    if len(mcq.options) != n_options:
        problems.append(f"{len(mcq.options)} options, the seed has {n_options}")
    if mcq.answer not in mcq.options:
        problems.append(f"key {mcq.answer} is not one of the options {''.join(mcq.options)}")
    normed = [_norm(v) for v in mcq.options.values()]
    if any(not v for v in normed):
        problems.append("an option is empty")
    if len(set(normed)) != len(normed):
        problems.append("two options are the same")
    if seed_question is not None and _norm(mcq.question) == _norm(seed_question):
        problems.append("the question repeats the seed question")
    return problems


def parse_choice(text: str, valid: Sequence[str]) -> str | None:
    """The option letter of the solution's last explicit answer statement
    (`synth.verify.extract_choice_letter`: position decides, not pattern); None if it states none
    or one outside `valid`."""
    letter = extract_choice_letter(text)
    return letter if letter in valid else None


def strict_majority(choices: Sequence[str | None]) -> tuple[str | None, float]:
    """(answer, vote share) where answer is chosen by more than half of all samples; else (None, share of the most common)."""
    if not choices:
        return None, 0.0
    counts = Counter(c for c in choices if c is not None)
    if not counts:
        return None, 0.0
    best, votes = max(counts.items(), key=lambda kv: (kv[1], -choices.index(kv[0])))
    share = votes / len(choices)
    return (best if votes * 2 > len(choices) else None), share
