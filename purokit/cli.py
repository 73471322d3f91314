"""The one command layer of every package: `python -m kaiyuan|mixtures|synth|proxy_eval|trainer <command> ...`.

A package declares its commands, each a `Command` (its arguments, its typed config, what it runs)
or a plain `argv -> exit code` function, and hands them to `dispatch`. One error policy for all:
a user error (a contract violated, an input file missing, a config field of the wrong type or
unknown, a YAML file that does not parse, an override not of the form `key.sub=value`) prints
ONE line `<prog>: error: <file>: field '<field>': <what>` and exits 2; anything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import yaml
from pydantic import ValidationError

from purokit.errors import ContractError, OverrideError



class UsageError(ValueError):
    """Arguments that do not fit together (argparse cannot say it: `--checkpoints` or `--sources`)."""


USER_ERRORS: tuple[type[BaseException], ...] = (ContractError, OverrideError, UsageError, FileNotFoundError,
                                                 ValidationError, yaml.YAMLError)


@dataclass(frozen=True)
class Command:
    """One subcommand. `config(path, overrides)` loads its typed config from `--config` (or
    `config_flag`; a name without dashes is a positional) plus trailing `key.sub=value` overrides
    into `args.cfg` before `run(args)`; `args(parser)` adds its other arguments."""

    run: Callable[[argparse.Namespace], int]
    help: str = ""
    args: Callable[[argparse.ArgumentParser], None] | None = None
    config: Callable[[str, list[str]], Any] | None = None
    config_flag: str = "--config"

    def __call__(self, argv: list[str], prog: str = "") -> int:
        ap = argparse.ArgumentParser(prog=prog, description=self.help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        if self.config is not None and self.config_flag.startswith("-"):
            ap.add_argument(self.config_flag, required=True, dest="config", help="the command's YAML file")
        elif self.config is not None:          # a positional: `python -m synth <generator> ...`
            ap.add_argument("config", metavar=self.config_flag, help="the command's YAML file (or a built-in name)")
        if self.config is not None:
            ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
        if self.args is not None:
            self.args(ap)
        args = ap.parse_intermixed_args(argv)
        if self.config is not None:
            args.cfg = self.config(args.config, args.overrides)
        return self.run(args)


Runnable = Union[Command, Callable[[list[str]], int]]


def user_error(e: BaseException) -> str:
    """A user error as one line naming the file and the field."""
    if isinstance(e, FileNotFoundError) and e.filename is not None:
        text = f"{e.filename}: no such file or directory"
    elif isinstance(e, ValidationError):
        err = e.errors()[0]
        text = f"{e.title}: field '{'.'.join(map(str, err['loc']))}': {err['msg']}"
    elif isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        text = f"{mark.name} line {mark.line + 1}: not valid YAML ({e.problem})"
    else:
        text = str(e)
    return " ".join(text.split())


def guard(prog: str, fn: Callable[..., int], *args: Any, errors: tuple[type[BaseException], ...] = ()) -> int:
    """`fn(*args)` under the error policy: user errors (`USER_ERRORS` and `errors`) are one
    `error:` line and exit 2; any other exception propagates with its traceback."""
    try:
        return fn(*args)
    except USER_ERRORS + errors as e:
        print(f"{prog + ': ' if prog else ''}error: {user_error(e)}", file=sys.stderr)
        return 2


def dispatch(doc: str, commands: dict[str, Runnable], argv: Sequence[str] | None = None, *,
             errors: tuple[type[BaseException], ...] = (), prog: str = "",
             default: Runnable | None = None) -> int:
    """Run `argv[0]`'s command on the rest: the module's doc with no argument or -h; an unknown
    command is exit 2 naming the known ones (or goes to `default` with the whole argv); errors as
    `guard` says (`errors`: more exception types that are bad input, not bugs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(doc)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands and default is None:
        print(doc)
        print(f"unknown command {name!r}; commands: {', '.join(commands)}", file=sys.stderr)
        return 2
    target, target_argv, where = (commands[name], rest, f"{prog} {name}") if name in commands else (default, argv, prog)
    if isinstance(target, Command):
        return guard(prog, target, target_argv, where.strip(), errors=errors)
    return guard(prog, target, target_argv, errors=errors)


def job_notes() -> Callable[[str], None]:
    """Where a job's `progress=` notes go from a command: the one reporter's `note`, so they print
    in the same stream and order as every command's progress lines."""
    from purokit.progress import Reporter

    return Reporter(None, unit="step", mode="line").note
