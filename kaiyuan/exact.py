"""Exact deduplication keys: documents are exact duplicates when their normalized texts are equal.

Normalization (issue 2, "Exact dedup on normalized text"): Unicode NFKC, case-folded, every run of
whitespace collapsed to one space and the ends stripped. The key is the 128-bit xxh3 digest of the
UTF-8 bytes of the normalized text (128 bits so that collisions stay negligible at billions of
documents, where 64 bits would not).
"""

from __future__ import annotations

import unicodedata
from typing import Iterable

import xxhash


def normalize_exact(text: str) -> str:
    """NFKC, case-fold, collapse whitespace."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def exact_key(text: str) -> bytes:
    """16-byte key of the normalized text."""
    return xxhash.xxh3_128_digest(normalize_exact(text).encode("utf-8"))


def exact_keys(texts: Iterable[str | None]) -> list[bytes]:
    return [exact_key(t or "") for t in texts]
