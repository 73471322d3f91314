"""`purokit <package> [args ...]`: every package's commands under one name, beside `python -m`.

`purokit` alone lists the packages and their commands (read from each package's `__main__` doc, so
listing imports none of them); `purokit <package> ...` runs what `python -m <package> ...` runs, with
the same output and exit status (`purokit demo` is `python -m purokit.demo`)."""

from __future__ import annotations

import ast
import importlib.util
import re
import runpy
import sys
from pathlib import Path

PACKAGES = {"kaiyuan": "kaiyuan", "synth": "synth", "proxy_eval": "proxy_eval", "mixtures": "mixtures",
            "trainer": "trainer", "demo": "purokit.demo"}
# a command line of a `__main__` doc: `name [| name ...]` at the margin, then options, a placeholder or
# two spaces; or a `python -m <module> name ...` line
_COMMAND = re.compile(r"^([a-z][\w-]*(?:\s*\|\s*[a-z][\w-]*)*)(?=\s*$|\s+[-<A-Z]|\s{2,})")
_RUN_LINE = re.compile(r"^\s*python -m [\w.]+ ([a-z][\w-]*|<\w+>)")


def main_doc(module: str) -> str:
    """The docstring of `<module>/__main__.py`, read without importing the module."""
    top, *rest = module.split(".")
    base = Path(importlib.util.find_spec(top).submodule_search_locations[0]).joinpath(*rest)
    return ast.get_docstring(ast.parse((base / "__main__.py").read_text(encoding="utf-8"))) or ""


def doc_commands(doc: str) -> tuple[str, list[str]]:
    """(the usage line, the command names) of a `__main__` doc."""
    usage, _, body = doc.partition("\n")
    names: list[str] = []
    for i, line in enumerate([usage.strip("`"), *body.splitlines()]):
        m = _RUN_LINE.match(line) or (i > 0 and _COMMAND.match(line))
        found = re.split(r"\s*\|\s*", m[1]) if m and m[1] != "<command>" else []
        names += [n for n in found if n not in names]
    return usage.strip("` "), names


def listing() -> str:
    rows = []
    for name, module in PACKAGES.items():
        usage, commands = doc_commands(main_doc(module))
        rows.append(f"  {name:<11} {', '.join(commands) or usage.split(module, 1)[-1].strip()}")
    return "\n".join(["usage: purokit <package> [command] [args ...]   (the same as python -m <package> ...)",
                      "", "packages and their commands:", *rows, "",
                      "`purokit <package> --help` shows a package's commands and their options."])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    if argv[0] not in PACKAGES:
        print(f"purokit: error: unknown package {argv[0]!r}; packages: {', '.join(PACKAGES)}", file=sys.stderr)
        return 2
    sys.argv = [f"purokit {argv[0]}", *argv[1:]]   # runpy sets argv[0] to the module's file, as -m does
    runpy.run_module(PACKAGES[argv[0]], run_name="__main__", alter_sys=True)   # its sys.exit ends us
    return 0


if __name__ == "__main__":
    sys.exit(main())
