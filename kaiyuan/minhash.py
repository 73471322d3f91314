"""MinHash-LSH math for near-duplicate detection, vectorized over Arrow batches with numpy.

The pipeline for a batch of documents (Puro §3.6.2: "MinHash deduplication", run within each
source; parameters follow FineWeb's precedent, which the report does not state):

1. `tokenize`: Unicode NFKC, lower-case, split on runs of characters that are not letters,
   digits or combining marks (so punctuation does not count) -> words; or, for text without
   spaces (Chinese, Japanese, Thai), its letters and digits one by one (`char` shingles).
2. `token_hashes`: xxh64 of each token's UTF-8 bytes (hashed once per distinct token in a batch).
3. `shingle_hashes`: every window of `n` consecutive tokens folded into one 64-bit hash
   (`fold64`); a document with fewer than `n` tokens (but at least one) gives one shingle of all
   of them, so short documents still get a signature. A document with no tokens has no shingles
   and never enters LSH (all such documents would otherwise collide).
4. `signatures`: datasketch's "affine64" scheme (datasketch >= 2.0): the shingle hash is
   pre-mixed with the MurmurHash3 finalizer, then permutation k is h -> a_k * h + b_k mod 2^64
   with odd a_k (a bijection), and the signature keeps the minimum per permutation. The
   permutations come from `np.random.RandomState(seed)` exactly as datasketch draws them, so our
   signature of a shingle-hash set equals `datasketch.MinHash(scheme="affine64", seed=seed)`'s.
5. `band_keys`: b bands of r rows, each band folded into one 64-bit key. Two documents become
   candidates when any band key is equal: P(candidate | Jaccard J) = 1 - (1 - J^r)^b.

`optimal_bands_rows` picks (b, r) for a target threshold by weighing the false-positive and
false-negative areas under that S-curve, as datasketch's `MinHashLSH` does; `lsh_bands_rows` is
kaiyuan's weighting (towards recall). Candidates are then verified exactly: `shingle_sets`,
`intersection_sizes` and `jaccard` give the exact Jaccard of the shingle-hash sets of many pairs
at once (one definition for Spark, the local paths and the benchmark's ground truth).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

U64 = np.uint64
MAX_U64 = np.iinfo(np.uint64).max

# MurmurHash3 fmix64 (datasketch's _FMIX_CONSTANTS[64])
_FMIX = (U64(33), U64(0xFF51AFD7ED558CCD), U64(33), U64(0xC4CEB9FE1A85EC53), U64(33))
# Multiplier for folding a sequence of 64-bit hashes (the 64-bit golden ratio, odd)
_FOLD_MUL = U64(0x9E3779B97F4A7C15)

# Letters, digits and combining marks are token characters; anything else separates tokens.
_SEPARATORS = r"[^\p{L}\p{N}\p{M}]+"
_NON_TOKEN_CHARS = r"[^\p{L}\p{N}\p{M}]"
# Scripts written without spaces between words
_NO_SPACE_SCRIPTS = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]"


# ---- 64-bit mixing -------------------------------------------------------------------------

def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: an avalanching bijection on uint64 (element-wise)."""
    s1, m1, s2, m2, s3 = _FMIX
    with np.errstate(over="ignore"):
        h = h ^ (h >> s1)
        h = h * m1
        h = h ^ (h >> s2)
        h = h * m2
        return h ^ (h >> s3)


def fold64(columns: Sequence[np.ndarray]) -> np.ndarray:
    """Fold equal-length uint64 arrays into one hash per position, order-sensitively:
    h = c0; h = fmix64(h * PHI + c_k) for k >= 1. Used for shingles and band keys."""
    h = np.asarray(columns[0], dtype=U64).copy()
    with np.errstate(over="ignore"):
        for c in columns[1:]:
            h = fmix64(h * _FOLD_MUL + np.asarray(c, dtype=U64))
    return h


def fold64_scalar(values: Sequence[int]) -> int:
    """`fold64` for one sequence, in plain Python integers (the reference for tests)."""
    mask = (1 << 64) - 1

    def fmix(h: int) -> int:
        h ^= h >> 33
        h = (h * 0xFF51AFD7ED558CCD) & mask
        h ^= h >> 33
        h = (h * 0xC4CEB9FE1A85EC53) & mask
        return h ^ (h >> 33)

    h = values[0] & mask
    for v in values[1:]:
        h = fmix((h * 0x9E3779B97F4A7C15 + v) & mask)
    return h


# ---- tokens and shingles -------------------------------------------------------------------

@dataclass(frozen=True)
class Ragged:
    """A batch of variable-length uint64 lists: values plus per-document lengths."""

    values: np.ndarray    # uint64, all documents concatenated
    lengths: np.ndarray   # int64, one per document

    @property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out


def _as_string_array(texts: pa.Array | pa.ChunkedArray | Sequence[str]) -> pa.Array:
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), type=pa.string())
    if pa.types.is_large_string(texts.type) or pa.types.is_string_view(texts.type):
        texts = texts.cast(pa.string())
    return texts


def normalize_for_shingles(texts: pa.Array) -> pa.Array:
    """NFKC + lower-case, vectorized in Arrow (nulls become empty strings)."""
    texts = pc.fill_null(_as_string_array(texts), "")
    return pc.utf8_lower(pc.utf8_normalize(texts, "NFKC"))


def uses_char_shingles(texts: pa.Array, min_no_space_fraction: float = 0.3) -> np.ndarray:
    """Per document: True when at least `min_no_space_fraction` of its characters belong to
    scripts written without spaces (Han, kana, Thai, ...), so word shingles would not work."""
    texts = pc.fill_null(_as_string_array(texts), "")
    n_script = pc.count_substring_regex(texts, _NO_SPACE_SCRIPTS).to_numpy(zero_copy_only=False)
    n_chars = pc.utf8_length(texts).to_numpy(zero_copy_only=False)
    return n_script >= min_no_space_fraction * np.maximum(n_chars, 1)


def _hash_strings(flat: pa.Array) -> np.ndarray:
    """xxh64 (seed 0) of each string's UTF-8 bytes; each distinct string is hashed once."""
    if len(flat) == 0:
        return np.zeros(0, dtype=U64)
    encoded = pc.dictionary_encode(flat)
    uniques = encoded.dictionary.to_pylist()
    table = np.fromiter((xxhash.xxh64_intdigest(s) for s in uniques), dtype=U64, count=len(uniques))
    return table[encoded.indices.to_numpy(zero_copy_only=False)]


def word_token_hashes(normalized: pa.Array) -> Ragged:
    """Words of already-normalized texts, hashed: one ragged uint64 list per document."""
    words = pc.split_pattern_regex(normalized, _SEPARATORS)
    flat = pc.list_flatten(words)
    parents = pc.list_parent_indices(words).to_numpy(zero_copy_only=False)
    keep = pc.greater(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    flat = flat.filter(pa.array(keep))
    lengths = np.bincount(parents[keep], minlength=len(normalized)).astype(np.int64)
    return Ragged(_hash_strings(flat), lengths)


def char_token_hashes(normalized: pa.Array) -> Ragged:
    """Letters/digits of already-normalized texts (separators dropped), one token per code point."""
    stripped = pc.replace_substring_regex(normalized, _NON_TOKEN_CHARS, "")
    values: list[np.ndarray] = []
    lengths = np.zeros(len(stripped), dtype=np.int64)
    for i, s in enumerate(stripped.to_pylist()):
        cps = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32).astype(U64)
        values.append(cps)
        lengths[i] = len(cps)
    flat = np.concatenate(values) if values else np.zeros(0, dtype=U64)
    # code points are tiny integers: mix them so shingle folding starts from spread-out values
    return Ragged(fmix64(flat + U64(0x5851F42D4C957F2D)), lengths)


def shingle_hashes(tokens: Ragged, n: int) -> Ragged:
    """Hashes of every window of `n` consecutive tokens within each document.

    A document with 1..n-1 tokens yields one shingle of all its tokens; one with none yields none.
    """
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    values, lengths = tokens.values, tokens.lengths
    total = len(values)
    n_full = np.maximum(lengths - n + 1, 0)
    short = (lengths > 0) & (lengths < n)
    offsets = tokens.offsets
    if total and n_full.any():
        # fold the window starting at every position, then keep the windows that fit in their doc
        cols = [values]
        for k in range(1, n):
            shifted = np.zeros(total, dtype=U64)
            shifted[: total - k] = values[k:] if k < total else shifted[:0]
            cols.append(shifted)
        folded = fold64(cols)
        ends = np.repeat(offsets[1:], lengths)
        valid = np.arange(total) + n <= ends
        full = folded[valid]
    else:
        full = np.zeros(0, dtype=U64)
    if not short.any():
        return Ragged(full, n_full.astype(np.int64))
    # splice one whole-document shingle in for each short document
    out_lengths = np.where(short, 1, n_full).astype(np.int64)
    out_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(out_lengths, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), dtype=U64)
    has_full = n_full > 0
    full_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(n_full, out=full_offsets[1:])
    shift = np.repeat(out_offsets[:-1][has_full] - full_offsets[:-1][has_full], n_full[has_full])
    out[np.arange(len(full)) + shift] = full
    for d in np.flatnonzero(short):
        out[out_offsets[d]] = fold64_scalar([int(x) for x in values[offsets[d]:offsets[d + 1]]])
    return Ragged(out, out_lengths)


def shingle_hashes_reference(tokens: Sequence[str], n: int) -> list[int]:
    """Pure-Python shingle hashes of one tokenized document (the reference for the vector path)."""
    hashes = [xxhash.xxh64_intdigest(t) for t in tokens]
    if not hashes:
        return []
    if len(hashes) < n:
        return [fold64_scalar(hashes)]
    return [fold64_scalar(hashes[i:i + n]) for i in range(len(hashes) - n + 1)]


def document_shingles(texts: pa.Array | Sequence[str], n: int, mode: str = "word") -> Ragged:
    """Text -> shingle hashes per document. `mode`: "word", "char", or "auto" (char shingles for
    documents mostly in scripts written without spaces, word shingles otherwise)."""
    texts = _as_string_array(texts)
    normalized = normalize_for_shingles(texts)
    if mode == "word":
        return shingle_hashes(word_token_hashes(normalized), n)
    if mode == "char":
        return shingle_hashes(char_token_hashes(normalized), n)
    if mode != "auto":
        raise ValueError(f"shingle mode must be word, char or auto, got {mode!r}")
    use_char = uses_char_shingles(texts)
    if not use_char.any():
        return shingle_hashes(word_token_hashes(normalized), n)
    words = shingle_hashes(word_token_hashes(normalized), n)
    chars = shingle_hashes(char_token_hashes(normalized.filter(pa.array(use_char))), n)
    # merge: take each document's shingles from the list its mode selects
    w_off, c_off = words.offsets, chars.offsets
    parts: list[np.ndarray] = []
    lengths = np.zeros(len(texts), dtype=np.int64)
    ci = 0
    for d in range(len(texts)):
        if use_char[d]:
            seg = chars.values[c_off[ci]:c_off[ci + 1]]
            ci += 1
        else:
            seg = words.values[w_off[d]:w_off[d + 1]]
        parts.append(seg)
        lengths[d] = len(seg)
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=U64)
    return Ragged(values, lengths)


# ---- signatures and bands ------------------------------------------------------------------

def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) for h -> a*h + b mod 2^64, drawn exactly as datasketch 2.x draws "affine64"."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 63, num_perm, dtype=U64) * U64(2) + U64(1)
    b = gen.randint(0, 1 << 64, num_perm, dtype=U64)
    return a, b


def signatures(shingles: Ragged, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signatures, uint64 [n_docs, num_perm]. Documents without shingles get MAX_U64
    everywhere (datasketch's empty value); callers keep those out of LSH."""
    n_docs = len(shingles.lengths)
    num_perm = len(a)
    sig = np.full((n_docs, num_perm), MAX_U64, dtype=U64)
    has = shingles.lengths > 0
    if not has.any():
        return sig
    h = fmix64(shingles.values)
    starts = shingles.offsets[:-1][has]
    rows = np.flatnonzero(has)
    tmp = np.empty_like(h)
    with np.errstate(over="ignore"):
        for k in range(num_perm):
            np.multiply(h, a[k], out=tmp)
            np.add(tmp, b[k], out=tmp)
            sig[rows, k] = np.minimum.reduceat(tmp, starts)
    return sig


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per band: int64 [n_docs, bands] (int64 so Spark can hold it as a long)."""
    if bands * rows > sig.shape[1]:
        raise ValueError(f"{bands} bands x {rows} rows need {bands * rows} permutations, the signatures have {sig.shape[1]}")
    keys = np.empty((sig.shape[0], bands), dtype=U64)
    for j in range(bands):
        keys[:, j] = fold64([sig[:, j * rows + i] for i in range(rows)])
    return keys.view(np.int64)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray | float:
    """Fraction of equal signature positions (last axis): the MinHash estimate of Jaccard."""
    return np.mean(np.asarray(sig_a) == np.asarray(sig_b), axis=-1)


# ---- exact Jaccard of shingle-hash sets (verification and ground truth) ---------------------

def shingle_sets(shingles: Ragged) -> Ragged:
    """Each document's shingle hashes as a set: sorted ascending, repeats dropped."""
    n = len(shingles.lengths)
    doc = np.repeat(np.arange(n, dtype=np.int64), shingles.lengths)
    order = np.lexsort((shingles.values, doc))
    v, d = shingles.values[order], doc[order]
    keep = np.ones(len(v), dtype=bool)
    keep[1:] = (v[1:] != v[:-1]) | (d[1:] != d[:-1])
    return Ragged(v[keep], np.bincount(d[keep], minlength=n).astype(np.int64))


def intersection_sizes(a: Ragged, b: Ragged) -> np.ndarray:
    """|A_i & B_i| for every pair i of sets, each sorted without repeats (as `shingle_sets` gives):
    the smaller set of each pair is binary-searched in the larger (numpy `searchsorted`), which
    costs O(|small| log |large|) per pair and no sort."""
    n = len(a.lengths)
    if len(b.lengths) != n:
        raise ValueError(f"{n} left sets but {len(b.lengths)} right sets")
    oa, ob = a.offsets, b.offsets
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        x, y = a.values[oa[i]:oa[i + 1]], b.values[ob[i]:ob[i + 1]]
        if len(x) < len(y):
            x, y = y, x
        if len(y) == 0:
            continue
        pos = np.minimum(np.searchsorted(x, y), len(x) - 1)
        out[i] = np.count_nonzero(x[pos] == y)
    return out


def jaccard(intersection: np.ndarray | int, size_a: np.ndarray | int, size_b: np.ndarray | int) -> np.ndarray:
    """Exact Jaccard |A & B| / |A | B| from integer counts (two empty sets: 1.0). The one
    definition used by the Spark verification, the local paths and the benchmark's ground truth."""
    inter = np.asarray(intersection, dtype=np.int64)
    union = np.asarray(size_a, dtype=np.int64) + np.asarray(size_b, dtype=np.int64) - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def exact_jaccard(a: set, b: set) -> float:
    """`jaccard` of two Python sets."""
    return float(jaccard(len(a & b), len(a), len(b)))


# ---- choosing bands and rows ---------------------------------------------------------------

def candidate_probability(jaccard: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """P(two documents with Jaccard J share at least one band) = 1 - (1 - J^r)^b."""
    return 1.0 - (1.0 - np.power(jaccard, rows)) ** bands


def threshold_of(bands: int, rows: int) -> float:
    """The Jaccard where the S-curve is steepest, approximately (1/b)^(1/r) (datatrove's comment)."""
    return (1.0 / bands) ** (1.0 / rows)


def false_positive_area(threshold: float, bands: int, rows: int) -> float:
    """Integral of P(candidate | J) over J in [0, threshold] (datasketch's definition)."""
    from scipy.integrate import quad

    return quad(lambda s: 1 - (1 - s ** float(rows)) ** float(bands), 0.0, threshold)[0]


def false_negative_area(threshold: float, bands: int, rows: int) -> float:
    """Integral of P(not candidate | J) over J in [threshold, 1]."""
    from scipy.integrate import quad

    return quad(lambda s: 1 - (1 - (1 - s ** float(rows)) ** float(bands)), threshold, 1.0)[0]


@functools.lru_cache(maxsize=64)
def lsh_bands_rows(threshold: float, num_perm: int, false_positive_weight: float = 0.05) -> tuple[int, int]:
    """kaiyuan's choice of (bands, rows) for a Jaccard threshold: `optimal_bands_rows` weighted
    towards recall (a missed pair is lost for good, a false candidate only costs a verification)."""
    return optimal_bands_rows(threshold, num_perm, false_positive_weight, 1.0 - false_positive_weight)


def optimal_bands_rows(threshold: float, num_perm: int, false_positive_weight: float = 0.5,
                       false_negative_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) with bands*rows <= num_perm minimizing the weighted false-positive and
    false-negative areas for a Jaccard `threshold`: the same search as datasketch's
    `MinHashLSH._optimal_param`, so both pick the same parameters."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if abs(false_positive_weight + false_negative_weight - 1.0) > 1e-9:
        raise ValueError("false_positive_weight + false_negative_weight must be 1")
    best = (0, 0)
    best_error = math.inf
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            error = (false_positive_area(threshold, b, r) * false_positive_weight
                     + false_negative_area(threshold, b, r) * false_negative_weight)
            if error < best_error:
                best_error = error
                best = (b, r)
    return best
