"""The one progress reporter of every command (trainer steps, synth prompts, kaiyuan/mixtures jobs).

Three forms, chosen by `mode`:
- `bar`: a tqdm bar on stderr, its postfix the latest message;
- `line`: `<unit> <done>/<total> | <message>` on stdout, every `every` units (and at the end),
  or at most every `every_s` seconds when that is set (a pipeline's log);
- `none`: silent (notes still go to the log).
`auto` is `bar` on a terminal and `line` otherwise. Notes (start, resume, eval) print with the
progress in the same form, so a log reads in order.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from purokit.log import get_logger

MODES = ("auto", "bar", "line", "none")

log = get_logger("purokit.progress")


def resolve_mode(mode: str, stream: TextIO | None = None) -> str:
    """`auto` -> `bar` on a terminal, `line` otherwise; anything else is returned as is."""
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    return "bar" if getattr(stream, "isatty", lambda: False)() else "line"


def progress_text(unit: str, done: int, total: int | None, message: str = "") -> str:
    """The line form: `step 3/10 | loss 2.1`; an unknown total prints as `step 3`."""
    count = f"{done}/{total}" if total is not None else f"{done}"
    return f"{unit} {count}" + (f" | {message}" if message else "")


class Reporter:
    """Progress of `total` units of work (None when unknown); `update(done, message)` after each."""

    def __init__(self, total: int | None, *, unit: str, mode: str = "auto", every: int = 1,
                 every_s: float | None = None, initial: int = 0,
                 write: Callable[[str], None] | None = None):
        self.mode = resolve_mode(mode)
        self.total, self.unit, self.every, self.every_s = total, unit, max(1, every), every_s
        self.done = initial
        self._write = write or (lambda text: print(text, flush=True))
        self._last_line = time.monotonic()
        self._bar = None
        if self.mode == "bar":
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, unit=unit, dynamic_ncols=True, file=sys.stderr,
                             mininterval=1.0)

    def _due(self, done: int) -> bool:
        if self.total is not None and done >= self.total:
            return True
        if self.every_s is not None:
            return time.monotonic() - self._last_line >= self.every_s
        return done % self.every == 0

    def update(self, done: int, message: str = "") -> None:
        """`done` units are finished now; `message` is the figures to show beside the count."""
        advanced, self.done = done - self.done, done
        if self._bar is not None:
            self._bar.update(advanced)
            if message:
                self._bar.set_postfix_str(message)
        elif self.mode == "line" and self._due(done):
            self._last_line = time.monotonic()
            self._write(progress_text(self.unit, done, self.total, message))

    def note(self, text: str) -> None:
        """A start / eval / resume note, in order with the progress (the log when silent)."""
        if self._bar is not None:
            self._bar.write(text)
        elif self.mode == "line":
            self._write(text)
        else:
            log.info(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
