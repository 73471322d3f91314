"""The shell commands the README shows, read from its fenced code blocks, keyed by what they run."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass(frozen=True)
class Command:
    line: int        # README line where the command starts
    text: str        # the command, continuation lines joined, trailing comment removed
    key: str         # what it runs: "python -m mixtures materialize", "spark-submit kaiyuan/jobs/pipeline.py", ...


def _strip_comment(text: str) -> str:
    """Drop a trailing `# comment` (a '#' after whitespace, outside quotes; `x.tar.gz#venv` stays)."""
    out, quote = [], None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).rstrip()


def command_key(text: str) -> str | None:
    """What a command runs; shell plumbing (printf, cd, tar, ...) is "shell <program>"."""
    words = shlex.split(text.replace("{", "_").replace("}", "_"))
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):   # leading VAR=value
        words = words[1:]
    if not words:
        return None
    head = words[0].lstrip("(")                                    # a subshell: (cd x && ...)
    if head == "make" and len(words) > 1:
        return f"make {words[1]}"
    if head in ("python", "python3") and len(words) > 3 and words[1] == "-m":
        return f"python -m {words[2]} {words[3]}"
    if head == "torchrun":
        m = words.index("-m")
        return f"torchrun -m {words[m + 1]} {words[m + 2]}"
    if head == "spark-submit":
        script = next(w for w in words[1:] if w.endswith(".py"))
        return f"spark-submit {script}"
    return f"shell {head}"


def readme_commands(path: Path = README) -> list[Command]:
    lines = path.read_text(encoding="utf-8").splitlines()
    cmds: list[Command] = []
    in_block, lang = False, ""
    pending: tuple[int, str] | None = None
    for no, raw in enumerate(lines, 1):
        if raw.startswith("```"):
            in_block, lang = (not in_block), raw[3:].strip()
            continue
        if not in_block or lang not in ("", "bash", "sh", "shell", "console"):
            continue
        start, text = pending if pending else (no, "")
        body = _strip_comment(raw) if not raw.lstrip().startswith("#") else ""
        if body.endswith("\\"):
            pending = (start, text + body[:-1] + " ")
            continue
        pending = None
        text = " ".join((text + body).split())
        key = command_key(text) if text else None
        if key:
            cmds.append(Command(start, text, key))
    return cmds
