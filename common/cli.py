"""The one shape of the subcommand CLIs (`python -m kaiyuan|mixtures|synth <command> ...`)."""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from common.errors import ContractError

Command = Callable[[list[str]], int]


def dispatch(doc: str, commands: dict[str, Command], argv: Sequence[str] | None = None, *,
             errors: tuple[type[BaseException], ...] = (ContractError,), prog: str = "",
             default: Command | None = None) -> int:
    """Run `argv[0]`'s command on the rest: the module's doc with no argument or -h; an unknown
    command is exit 2 naming the known ones (or goes to `default` with the whole argv); `errors`
    (bad input, not bugs) print as one `error:` line with exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(doc)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands and default is None:
        print(doc)
        print(f"unknown command {name!r}; commands: {', '.join(commands)}", file=sys.stderr)
        return 2
    try:
        return commands[name](rest) if name in commands else default(argv)
    except errors as e:
        print(f"{prog + ': ' if prog else ''}error: {e}", file=sys.stderr)
        return 2
