"""Errors that name the file, record and field, so a user knows what to fix."""

from __future__ import annotations


class ContractError(ValueError):
    """A contract file (manifest, spec, record) is missing, malformed or of the wrong version."""

    def __init__(self, path: object, message: str, field: str | None = None):
        self.path = str(path)
        self.field = field
        where = f"{self.path}" + (f": field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")


class OverrideError(ValueError):
    """A command-line override that is not `key.sub=value`, or names a path the config lacks."""
