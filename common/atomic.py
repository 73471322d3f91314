"""Atomic outputs: write under a temporary name in the same directory, fsync, then rename.

A reader never sees a half-written file or directory: either the old one, or the new one, or none.
A killed writer leaves only `.tmp-*` debris, which `clean_stale_tmp` removes on the next run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside `final`; on success it is renamed onto `final`.

    Works for files and directories (the caller creates whichever it wants at the yielded path).
    On an exception the temporary is removed and `final` is untouched.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{final.name}.", suffix=suffix, dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        if final.is_dir() and not final.is_symlink():
            # os.replace cannot replace a non-empty directory: move the old one aside first.
            old = final.with_name(f"{TMP_PREFIX}{final.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
        raise


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON with sorted keys and a trailing newline, so equal objects give equal bytes."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n")


def clean_stale_tmp(directory: str | os.PathLike) -> list[Path]:
    """Remove temporaries a killed writer left in `directory` (not recursive). Returns what was removed."""
    directory = Path(directory)
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        if p.name.startswith(TMP_PREFIX):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed
