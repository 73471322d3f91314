"""Atomic outputs: a reader never sees a half-written file or directory, only the old one, the new
one, or none.

Locally: write under a temporary name in the same directory, fsync, then rename; a killed writer
leaves only `.tmp-*` debris, which `clean_stale_tmp` removes on the next run. On an object store
(a URL): one PUT for a file, the commit protocol of `purokit.storage` for a directory.
"""

from __future__ import annotations

import json
from typing import Any

from purokit.storage import TMP_PREFIX, AnyPath, atomic_path, clean_stale_tmp, write_bytes

__all__ = ["TMP_PREFIX", "atomic_path", "clean_stale_tmp", "write_bytes", "write_text", "write_json"]


def write_text(path: AnyPath, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: AnyPath, obj: Any) -> None:
    """Write JSON with sorted keys and a trailing newline, so equal objects give equal bytes."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n")
