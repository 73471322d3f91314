"""SQLite request/response cache keyed by a content hash of (model, messages, parameters, seed).

A rerun of the same generator sends no request whose answer is already here, and a killed run
resumes by replaying its answered requests for free. The endpoint URL is deliberately not in the
key: the same model behind another endpoint gives the same answer for the same seed.

Writes are batched (one transaction per `commit_every` inserts or `commit_interval_s`), in WAL
mode with synchronous=NORMAL: a SIGKILL loses at most the last uncommitted batch, whose requests
are then simply sent again. Nothing else depends on the cache being complete.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from purokit.hashing import canonical_json, sha256_bytes

CACHE_SCHEMA = "synth-cache/1"


def cache_key(payload: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(payload).encode("utf-8"))


class ResponseCache:
    def __init__(self, path: str | os.PathLike, commit_every: int = 256, commit_interval_s: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
        self._db.execute("CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, "
                         "response TEXT NOT NULL, created REAL)")
        row = self._db.execute("SELECT v FROM meta WHERE k='schema'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (CACHE_SCHEMA,))
        elif row[0] != CACHE_SCHEMA:
            raise ValueError(f"{self.path}: cache schema is {row[0]!r}, this code reads {CACHE_SCHEMA!r}; "
                             "move the file away to start a fresh cache")
        self.commit_every = commit_every
        self.commit_interval_s = commit_interval_s
        self._pending = 0
        self._last_commit = time.monotonic()
        self._in_tx = False
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> dict[str, Any] | None:
        row = self._db.execute("SELECT response FROM responses WHERE key=?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, model: str, response: dict[str, Any]) -> None:
        if not self._in_tx:
            self._db.execute("BEGIN")
            self._in_tx = True
        self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                         (key, model, json.dumps(response, ensure_ascii=False), time.time()))
        self._pending += 1
        if self._pending >= self.commit_every or time.monotonic() - self._last_commit >= self.commit_interval_s:
            self.commit()

    def commit(self) -> None:
        if self._in_tx:
            self._db.execute("COMMIT")
            self._in_tx = False
        self._pending = 0
        self._last_commit = time.monotonic()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def close(self) -> None:
        self.commit()
        self._db.close()
