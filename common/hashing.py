"""Content hashes and input fingerprints used by every manifest."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

_CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every config hash is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def config_hash(config: Any) -> str:
    """sha256 of the canonical JSON of a config (dicts, lists, pydantic models' `model_dump()`)."""
    if hasattr(config, "model_dump"):
        config = config.model_dump(mode="json")
    return sha256_bytes(canonical_json(config).encode("utf-8"))


def _iter_files(path: Path) -> Iterable[Path]:
    if path.is_file():
        yield path
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if not name.startswith((".", "_")):
                yield Path(root) / name


def fingerprint(path: str | os.PathLike, content: bool = True) -> dict[str, Any]:
    """Fingerprint of a file or directory tree (hidden and `_`-prefixed entries skipped).

    content=True hashes every byte (what a reproducibility manifest wants); content=False uses
    sizes and modification times only, for inputs too large to re-read on every run.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    h = hashlib.sha256()
    n_files = 0
    n_bytes = 0
    for f in _iter_files(path):
        st = f.stat()
        rel = f.relative_to(path).as_posix() if path.is_dir() else f.name
        h.update(rel.encode("utf-8") + b"\0" + str(st.st_size).encode() + b"\0")
        if content:
            h.update(bytes.fromhex(sha256_file(f)))
        else:
            h.update(str(st.st_mtime_ns).encode())
        n_files += 1
        n_bytes += st.st_size
    return {
        "path": str(path),
        "kind": "content-sha256" if content else "size-mtime",
        "digest": h.hexdigest(),
        "n_files": n_files,
        "n_bytes": n_bytes,
    }


def stable_id(*parts: Any, n_hex: int = 16) -> str:
    """A short deterministic id from its parts (e.g. source, origin file, line number)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8"))
    return h.hexdigest()[:n_hex]
