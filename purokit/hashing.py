"""Content hashes and input fingerprints used by every manifest."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from purokit import storage
from purokit.storage import sha256_file

__all__ = ["sha256_file", "sha256_bytes", "canonical_json", "config_hash", "fingerprint", "stable_id"]


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
    if storage.is_remote(path):
        return _remote_fingerprint(str(path), content)
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
            try:
                h.update(bytes.fromhex(sha256_file(f)))
            except OSError as e:
                # no read permission, an I/O error: the reader quarantines the file as `unreadable`;
                # the fingerprint records that it could not be read (and changes once it can)
                h.update(f"unreadable:{e.errno}".encode())
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


def _remote_fingerprint(url: str, content: bool) -> dict[str, Any]:
    """`fingerprint` of an object-store file or prefix; without content, sizes and ETags."""
    p = storage.path(url)
    if p.is_file():
        listing, base = storage.list_files(p, hidden=True), p.parent
    elif p.is_dir():
        listing, base = storage.list_files(p), p
    else:
        raise FileNotFoundError(f"input not found: {url}")
    h = hashlib.sha256()
    for rel, n, stamp in listing:
        h.update(rel.encode("utf-8") + b"\0" + str(n).encode() + b"\0")
        h.update(bytes.fromhex(sha256_file(base / rel)) if content else stamp.encode())
    return {"path": url, "kind": "content-sha256" if content else "size-etag", "digest": h.hexdigest(),
            "n_files": len(listing), "n_bytes": sum(n for _, n, _ in listing)}


def stable_id(*parts: Any, n_hex: int = 16) -> str:
    """A short deterministic id from its parts (e.g. source, origin file, line number)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8"))
    return h.hexdigest()[:n_hex]
