"""Multiple choice: the letter of the last explicit answer statement."""

from __future__ import annotations

import re

# ---- multiple choice ----------------------------------------------------------------------------

# Explicit answer statements. A letter counts only when it stands alone (followed by the end, or
# punctuation then a space), so "e.g. option C" is not an answer E; the *last* statement wins, so
# "Answer: A ... actually B" is B.
_LETTER_END = r"(?=\s*(?:$|[).,;:!*\]]?(?:\s|$)))"
_MC = [re.compile(p, re.MULTILINE) for p in (
    r"\\boxed\{\s*\(?([A-J])\)?\s*\}",
    r"(?i:answer)\**\s*(?:is|should\s+be|would\s+be|:|=)\s*:?\s*\**\s*(?:option\s+|choice\s+)?\(?([A-J])\)?\**" + _LETTER_END,
    r"(?i:answer)\**\s*(?:is|:|=)\s*\**\s*\(([a-j])\)",
    r"(?i:answer)\s*:\s*([a-j])\s*$",
    r"^\s*\**\(?([A-J])\)?\**\s*$",
    r"(?i:\b(?:option|choice))\s+\(?([A-J])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best))",
    r"(?i:\b(?:actually|instead|rather|correction|so\s+it'?s|i\s+(?:choose|pick|select)|i'?ll\s+go\s+with|go\s+with))"
    r",?\s+(?:it'?s\s+|it\s+is\s+|option\s+|choice\s+)?\(?([A-J])\)?" + _LETTER_END,
)]


def choice_statements(text: str) -> list[tuple[int, str]]:
    """(position, letter) of every explicit answer statement, in text order."""
    found = {m.start(1): m.group(1).upper() for pat in _MC for m in pat.finditer(text)}
    return sorted(found.items())


def extract_choice_letter(text: str) -> str | None:
    """The letter of the last explicit answer statement, or None."""
    found = choice_statements(text)
    return found[-1][1] if found else None
