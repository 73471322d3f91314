"""The shard set contract (ARCHITECTURE.md contract 4): static token files plus a manifest.

A shard set is a directory:

    manifest.json                 ShardManifest (schema "shards/1"), the only file a reader trusts
    <name>.bin                    the token stream of one shard: little-endian uint16 when the
                                  vocabulary fits in 16 bits, else uint32; every document is stored
                                  as its tokens followed by EOS, documents back to back
    <name>.idx.parquet            the document index of that shard: one row per document
                                  (token_start, n_tokens incl. EOS, doc_id, component, bucket,
                                  rank, copy[, n_loss_tokens])
    <name>.mask                   SFT only: one uint8 per token, 1 where the token is a training
                                  target (assistant tokens), 0 elsewhere

The stream the trainer reads is the concatenation of the shards in manifest order (Puro §3.6.2:
"fixed shards that are read sequentially during training, without online mixing or sampling").
Documents never straddle two shard files; training windows may.

The manifest is a *content* manifest: the same spec, inputs and seeds give byte-identical
manifests (Puro testable behaviour 8), so it records no wall-clock time; timings and the engine
that wrote the set go to `run.json` beside it.

Integrity on the default read path (no full re-hash needed):
- the manifest carries `manifest_digest`, the sha256 of its own other fields: a hand-edited
  `seq_len` or shard list is refused on open;
- every `BLOCK_BYTES` (1 MiB) of a token file has an xxh3-64 checksum, stored in the metadata of
  the shard's index (key `purokit.block_xxh3`; the index itself is covered by its sha256 in the
  manifest). `ShardSet.read` verifies each block the first time it touches it, and checks its
  token ids against the vocabulary, so a flipped bit is named by file and byte offset before a
  single corrupted token reaches the trainer;
- `verify()` (`inspect --verify`) re-hashes every byte with sha256.
Sets written before block checksums (no `block_bytes` on their shards, no `manifest_digest`) are
still read: with a warning, their token ids checked against the vocabulary only.

One writer (`ShardFileWriter` per file, `build_manifest` + `ShardManifest.write` for the set), one reader (`ShardSet.open`; the training
iterator on top of it lives in `mixtures.reader`).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from purokit import atomic
from purokit import storage
from purokit.config import StrictModel
from purokit.errors import ContractError
from purokit.hashing import canonical_json, sha256_file
from purokit.manifest import MANIFEST_NAME, RunManifest

SHARDS_SCHEMA = "shards/1"
TOKENS_SUFFIX = ".bin"
INDEX_SUFFIX = ".idx.parquet"
MASK_SUFFIX = ".mask"
RUN_RECORD_NAME = "run.json"
BLOCK_BYTES = 1 << 20                       # token bytes per block checksum
BLOCKS_KEY = b"purokit.block_xxh3"          # index metadata: little-endian uint64 xxh3-64 per block, hex

INDEX_SCHEMA = pa.schema([
    ("token_start", pa.int64()),     # offset of the document's first token inside this shard
    ("n_tokens", pa.int64()),        # tokens including the trailing EOS
    ("doc_id", pa.string()),
    ("component", pa.string()),
    ("bucket", pa.int32()),          # curriculum bucket (Puro §3.4), -1 when the set has none
    ("rank", pa.float64()),          # within-component rank r(d) in [0, 1), NaN when none
    ("copy", pa.int32()),            # 0 for the first occurrence, k for the k-th repetition
])
SFT_INDEX_SCHEMA = INDEX_SCHEMA.append(pa.field("n_loss_tokens", pa.int64()))


class ShardError(ContractError):
    """A shard set is missing, truncated, corrupted, or does not match what the caller expects."""


class TokenizerMismatch(ShardError):
    """The shard set was tokenized with a different tokenizer than the one given."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits in 16 bits, else uint32; always little-endian."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
    return {np.dtype("<u2"): "uint16", np.dtype("<u4"): "uint32"}[np.dtype(dtype)]


def dtype_from_name(name: str) -> np.dtype:
    try:
        return {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}[name]
    except KeyError:
        raise ValueError(f"unknown token dtype {name!r} (uint16 or uint32)") from None


# ---- manifest models ----------------------------------------------------------------------------

class TokenizerIdentity(StrictModel):
    """What a shard set was tokenized with: enough to refuse a mismatching tokenizer.

    `files` maps each file that defines the tokenizer (tokenizer.json, a .tiktoken rank file) to
    its sha256; `settings` holds anything else that changes the ids (split pattern, special tokens).
    `digest` is the sha256 of all of it and is what readers compare.
    """

    kind: str                      # "hf" | "tiktoken" | "qwen3" | "synthetic"
    name: str
    vocab_size: int
    eos_id: int
    pad_id: int | None = None
    files: dict[str, str] = {}
    settings: dict[str, Any] = {}
    digest: str = ""

    def model_post_init(self, __context: Any) -> None:
        want = self.compute_digest()
        if not self.digest:
            self.digest = want
        elif self.digest != want:
            raise ValueError(f"tokenizer digest {self.digest[:12]}… does not match its fields ({want[:12]}…)")

    def compute_digest(self) -> str:
        body = {"kind": self.kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "files": dict(sorted(self.files.items())), "settings": self.settings}
        return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()

    @classmethod
    def synthetic(cls, vocab_size: int, eos_id: int, name: str = "synthetic") -> "TokenizerIdentity":
        """For shard sets made from token lists (tests, toy data): no files, only the id space."""
        return cls(kind="synthetic", name=name, vocab_size=vocab_size, eos_id=eos_id)


class ShardFile(StrictModel):
    """One shard: its token file, document index and optional loss mask, with sizes and hashes,
    plus the composition figures the manifest's per-segment tables are summed from."""

    name: str
    segment: str                   # e.g. "b0003" (curriculum bucket 3), "u0003", "t0000", "e0000"
    n_tokens: int
    n_docs: int
    n_bytes: int
    sha256: str
    index_n_bytes: int
    index_sha256: str
    mask_sha256: str | None = None
    n_loss_tokens: int | None = None
    block_bytes: int | None = None             # checksum block size of the token file; None: written without
    tokens_by_component: dict[str, int] = {}
    rank_token_sum_by_component: dict[str, float] = {}   # sum over docs of rank * n_tokens

    @property
    def tokens_path(self) -> str:
        return self.name + TOKENS_SUFFIX

    @property
    def index_path(self) -> str:
        return self.name + INDEX_SUFFIX

    @property
    def mask_path(self) -> str | None:
        return self.name + MASK_SUFFIX if self.mask_sha256 is not None else None


class CompositionStats(StrictModel):
    """Token composition of one part of a stream (a bucket of the pool, or a segment of the stream)."""

    name: str
    n_tokens: int
    n_docs: int
    tokens_by_component: dict[str, int]
    mean_rank_by_component: dict[str, float | None]
    mean_rank: float | None        # token-weighted mean within-component rank over all components


class ComponentUse(StrictModel):
    """What the set took from one component: the fingerprint of the component manifest it read and
    the counts of its retention rule and budget."""

    name: str
    path: str
    manifest_sha256: str
    n_docs_read: int
    n_docs_retained: int
    n_tokens_retained: int         # stream tokens (text + EOS) of the retained documents
    n_docs_used: int               # in this set, counting repetitions
    n_tokens_used: int
    details: dict[str, Any] = {}   # retention rule, score field, direction, quarantine counts, ...


class ShardManifest(RunManifest):
    """Contract 4. Content only (no wall-clock time): equal inputs give equal bytes."""

    SCHEMA = SHARDS_SCHEMA
    created_at: str = ""           # deliberately empty; `run.json` has the time (see module doc)
    kind: str = "pretrain"         # "pretrain" | "sft"
    stream: str                    # "curriculum" | "uniform" | "eval" | "slice" | "tokens" | ...
    tokenizer: TokenizerIdentity
    seq_len: int
    dtype: str
    eos_id: int
    n_tokens: int
    n_docs: int
    shards: list[ShardFile]
    segments: list[CompositionStats] = []
    bucket_count: int | None = None
    buckets: list[CompositionStats] = []
    seeds: dict[str, int] = {}
    spec_hash: str | None = None
    components: list[ComponentUse] = []
    extra: dict[str, Any] = {}     # e.g. the transition window: {"transition": {...}}
    manifest_digest: str = ""      # sha256 of every other field, set on write, checked on read

    @property
    def token_dtype(self) -> np.dtype:
        return dtype_from_name(self.dtype)

    def compute_digest(self) -> str:
        body = {k: v for k, v in super().to_json_dict().items() if k != "manifest_digest"}
        return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()

    def to_json_dict(self) -> dict[str, Any]:
        return {**super().to_json_dict(), "manifest_digest": self.compute_digest()}

    @classmethod
    def read(cls, path: str | os.PathLike) -> "ShardManifest":
        """Read, validate, and check the manifest against its own digest (a hand-edited field is
        refused: the set would be read with other parameters than it was written with)."""
        manifest = super().read(path)
        mpath = storage.path(path)
        mpath = mpath / MANIFEST_NAME if mpath.is_dir() else mpath
        if manifest.manifest_digest and manifest.manifest_digest != manifest.compute_digest():
            raise ShardError(mpath, f"does not match its own digest (manifest_digest "
                                    f"{manifest.manifest_digest[:12]}…, content {manifest.compute_digest()[:12]}…): "
                                    "the file was edited or damaged after it was written; re-materialize the set",
                             field="manifest_digest")
        return manifest

    @property
    def set_digest(self) -> str:
        """Identity of the token stream: order, names and content hashes of every shard."""
        body = [(s.name, s.n_tokens, s.sha256, s.mask_sha256) for s in self.shards]
        return hashlib.sha256(canonical_json([self.tokenizer.digest, self.dtype, body]).encode()).hexdigest()


# ---- statistics ---------------------------------------------------------------------------------

def composition(name: str, shards: Iterable[ShardFile]) -> CompositionStats:
    """Sum per-shard figures into one composition row (token-weighted mean ranks)."""
    tokens: dict[str, int] = {}
    rank_sums: dict[str, float] = {}
    n_tokens = n_docs = 0
    has_rank: set[str] = set()
    for s in shards:
        n_tokens += s.n_tokens
        n_docs += s.n_docs
        for c, t in s.tokens_by_component.items():
            tokens[c] = tokens.get(c, 0) + t
        for c, r in s.rank_token_sum_by_component.items():
            rank_sums[c] = rank_sums.get(c, 0.0) + r
            has_rank.add(c)
    return composition_from_sums(name, n_tokens, n_docs, tokens, rank_sums)


def composition_from_sums(name: str, n_tokens: int, n_docs: int, tokens_by_component: dict[str, int],
                          rank_token_sum_by_component: dict[str, float]) -> CompositionStats:
    tokens = dict(sorted(tokens_by_component.items()))
    means: dict[str, float | None] = {}
    ranked_tokens = 0
    ranked_sum = 0.0
    for c, t in tokens.items():
        if c in rank_token_sum_by_component and t > 0:
            means[c] = _round(rank_token_sum_by_component[c] / t)
            ranked_tokens += t
            ranked_sum += rank_token_sum_by_component[c]
        else:
            means[c] = None
    overall = _round(ranked_sum / ranked_tokens) if ranked_tokens else None
    return CompositionStats(name=name, n_tokens=n_tokens, n_docs=n_docs, tokens_by_component=tokens,
                            mean_rank_by_component=means, mean_rank=overall)


def _round(x: float) -> float:
    # 12 significant digits: sums taken in different orders (local vs Spark) agree to far better
    # than this, so the manifests stay byte-identical.
    return float(f"{x:.12g}")


# ---- writer -------------------------------------------------------------------------------------

@dataclass
class ShardFileWriter:
    """Streams documents into one shard (tokens, index, optional mask), hashing as it writes.

    Files go to temporary names and are renamed into place by `close()`, so a killed writer leaves
    only `.tmp-*` debris.
    """

    directory: Path
    name: str
    dtype: np.dtype
    segment: str = ""
    with_mask: bool = False
    vocab_size: int | None = None
    _n_tokens: int = 0
    _n_loss: int = 0
    _rows: dict[str, list] = field(default_factory=lambda: {k: [] for k in SFT_INDEX_SCHEMA.names})
    _tok_by_comp: dict[str, int] = field(default_factory=dict)
    _rank_by_comp: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dtype = np.dtype(self.dtype)
        self._max_id = int(np.iinfo(self.dtype).max) if self.vocab_size is None else self.vocab_size - 1
        self._tmp_tokens = self.directory / f"{atomic.TMP_PREFIX}{self.name}{TOKENS_SUFFIX}"
        self._tmp_mask = self.directory / f"{atomic.TMP_PREFIX}{self.name}{MASK_SUFFIX}"
        self._fh = open(self._tmp_tokens, "wb")
        self._hash = hashlib.sha256()
        self._mfh = open(self._tmp_mask, "wb") if self.with_mask else None
        self._mhash = hashlib.sha256() if self.with_mask else None
        self._blocks: list[int] = []
        self._block_hash = xxhash.xxh3_64()
        self._block_fill = 0

    def _write_tokens(self, data: bytes) -> None:
        """Write token bytes, feeding the sha256 of the file and the checksum of every block."""
        self._fh.write(data)
        self._hash.update(data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), BLOCK_BYTES - self._block_fill)
            self._block_hash.update(view[:take])
            self._block_fill += take
            view = view[take:]
            if self._block_fill == BLOCK_BYTES:
                self._blocks.append(self._block_hash.intdigest())
                self._block_hash.reset()
                self._block_fill = 0

    def add(self, tokens: np.ndarray | Sequence[int], doc_id: str, component: str = "", bucket: int = -1,
            rank: float = math.nan, copy: int = 0, loss_mask: np.ndarray | Sequence[int] | None = None) -> None:
        """Append one document; `tokens` must already end with EOS (the materializer adds it)."""
        arr = np.asarray(tokens)
        n = int(arr.shape[0])
        if n == 0:
            raise ValueError(f"document {doc_id!r} has no tokens (not even EOS)")
        if arr.dtype != self.dtype:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi > self._max_id:
                raise ValueError(f"document {doc_id!r} has token id {hi if hi > self._max_id else lo} outside "
                                 f"[0, {self._max_id}] for dtype {dtype_name(self.dtype)}")
            arr = arr.astype(self.dtype)
        self._write_tokens(arr.tobytes())
        if self.with_mask:
            if loss_mask is None:
                raise ValueError(f"shard {self.name} stores a loss mask; document {doc_id!r} has none")
            m = np.asarray(loss_mask, dtype=np.uint8)
            if m.shape[0] != n:
                raise ValueError(f"document {doc_id!r}: loss mask has {m.shape[0]} entries for {n} tokens")
            mb = m.tobytes()
            self._mfh.write(mb)  # type: ignore[union-attr]
            self._mhash.update(mb)  # type: ignore[union-attr]
            n_loss = int(m.sum())
            self._n_loss += n_loss
        elif loss_mask is not None:
            raise ValueError(f"shard {self.name} has no loss mask; pass with_mask=True to store one")
        else:
            n_loss = 0
        rows = self._rows
        rows["token_start"].append(self._n_tokens)
        rows["n_tokens"].append(n)
        rows["doc_id"].append(str(doc_id))
        rows["component"].append(component)
        rows["bucket"].append(int(bucket))
        rows["rank"].append(float(rank))
        rows["copy"].append(int(copy))
        rows["n_loss_tokens"].append(n_loss)
        self._n_tokens += n
        self._tok_by_comp[component] = self._tok_by_comp.get(component, 0) + n
        if not math.isnan(rank):
            self._rank_by_comp[component] = self._rank_by_comp.get(component, 0.0) + rank * n

    def add_many(self, flat: np.ndarray, lengths: np.ndarray, doc_ids: Sequence[str], components: Sequence[str],
                 buckets: np.ndarray, ranks: np.ndarray, copies: np.ndarray) -> None:
        """Append documents given as one flat token array (each already ending with EOS) and their
        lengths: the fast path of materialization (pretraining only, no loss mask)."""
        if self.with_mask:
            raise ValueError("add_many writes no loss mask; use add() for SFT shards")
        flat = np.asarray(flat)
        lengths = np.asarray(lengths, dtype=np.int64)
        if flat.size != int(lengths.sum()) or np.any(lengths <= 0):
            raise ValueError("flat tokens and lengths disagree (or a document has no tokens)")
        if flat.dtype != self.dtype:
            if flat.size and (int(flat.min()) < 0 or int(flat.max()) > self._max_id):
                raise ValueError(f"token id outside [0, {self._max_id}] for dtype {dtype_name(self.dtype)}")
            flat = flat.astype(self.dtype)
        self._write_tokens(flat.tobytes())
        starts = self._n_tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]]) if lengths.size else lengths
        rows = self._rows
        rows["token_start"].extend(starts.tolist())
        rows["n_tokens"].extend(lengths.tolist())
        rows["doc_id"].extend(str(d) for d in doc_ids)
        rows["component"].extend(components)
        rows["bucket"].extend(np.asarray(buckets, dtype=np.int64).tolist())
        ranks = np.asarray(ranks, dtype=np.float64)
        rows["rank"].extend(ranks.tolist())
        rows["copy"].extend(np.asarray(copies, dtype=np.int64).tolist())
        rows["n_loss_tokens"].extend([0] * lengths.size)
        self._n_tokens += int(lengths.sum())
        comps = np.asarray(components, dtype=object)
        for c in dict.fromkeys(components):
            m = comps == c
            self._tok_by_comp[c] = self._tok_by_comp.get(c, 0) + int(lengths[m].sum())
            r = ranks[m]
            ok = ~np.isnan(r)
            if ok.any():
                self._rank_by_comp[c] = self._rank_by_comp.get(c, 0.0) + float((r[ok] * lengths[m][ok]).sum())

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    def close(self) -> ShardFile:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        if self._mfh is not None:
            self._mfh.flush()
            os.fsync(self._mfh.fileno())
            self._mfh.close()
        schema = SFT_INDEX_SCHEMA if self.with_mask else INDEX_SCHEMA
        if self._block_fill:
            self._blocks.append(self._block_hash.intdigest())
        schema = schema.with_metadata({BLOCKS_KEY: np.asarray(self._blocks, dtype="<u8").tobytes().hex().encode()})
        table = pa.table({k: self._rows[k] for k in schema.names}, schema=schema)
        index_path = self.directory / (self.name + INDEX_SUFFIX)
        with atomic.atomic_path(index_path) as tmp:
            pq.write_table(table, tmp, compression="zstd", compression_level=3, row_group_size=1 << 20)
        os.replace(self._tmp_tokens, self.directory / (self.name + TOKENS_SUFFIX))
        if self._mfh is not None:
            os.replace(self._tmp_mask, self.directory / (self.name + MASK_SUFFIX))
        return ShardFile(
            name=self.name, segment=self.segment, n_tokens=self._n_tokens, n_docs=len(self._rows["doc_id"]),
            n_bytes=self._n_tokens * self.dtype.itemsize, sha256=self._hash.hexdigest(),
            index_n_bytes=index_path.stat().st_size, index_sha256=sha256_file(index_path),
            mask_sha256=self._mhash.hexdigest() if self._mhash is not None else None,
            n_loss_tokens=self._n_loss if self.with_mask else None, block_bytes=BLOCK_BYTES,
            tokens_by_component=dict(sorted(self._tok_by_comp.items())),
            rank_token_sum_by_component={c: _round(v) for c, v in sorted(self._rank_by_comp.items())},
        )

    def abort(self) -> None:
        for fh in (self._fh, self._mfh):
            if fh is not None and not fh.closed:
                fh.close()
        for p in (self._tmp_tokens, self._tmp_mask):
            p.unlink(missing_ok=True)


def build_manifest(*, shards: list[ShardFile], tokenizer: TokenizerIdentity, seq_len: int, stream: str,
                   job: str, kind: str = "pretrain", config: dict[str, Any] | None = None,
                   segments_order: list[str] | None = None, buckets: list[CompositionStats] | None = None,
                   bucket_count: int | None = None, seeds: dict[str, int] | None = None,
                   spec_hash: str | None = None, components: list[ComponentUse] | None = None,
                   inputs: list | None = None, counts: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> ShardManifest:
    """Assemble the manifest from per-shard results (the local path and the Spark tasks return the
    same `ShardFile` records, so both assemble identical manifests)."""
    if not shards:
        raise ValueError("a shard set needs at least one shard")
    dtypes = {s.n_bytes // max(s.n_tokens, 1) for s in shards if s.n_tokens}
    dtype = token_dtype(tokenizer.vocab_size)
    if dtypes - {dtype.itemsize}:
        raise ValueError(f"shards were written with {dtypes} bytes per token, the tokenizer needs {dtype.itemsize}")
    order = segments_order or list(dict.fromkeys(s.segment for s in shards))
    by_segment: dict[str, list[ShardFile]] = {}
    for s in shards:
        by_segment.setdefault(s.segment, []).append(s)
    segments = [composition(seg, by_segment[seg]) for seg in order if seg in by_segment]
    return ShardManifest(
        job=job, config=config or {}, inputs=inputs or [], counts=counts or {},
        outputs=[f for s in shards for f in (s.tokens_path, s.index_path) + ((s.mask_path,) if s.mask_path else ())],
        kind=kind, stream=stream, tokenizer=tokenizer, seq_len=seq_len, dtype=dtype_name(dtype),
        eos_id=tokenizer.eos_id, n_tokens=sum(s.n_tokens for s in shards), n_docs=sum(s.n_docs for s in shards),
        shards=shards, segments=segments, bucket_count=bucket_count, buckets=buckets or [], seeds=seeds or {},
        spec_hash=spec_hash, components=components or [], extra=extra or {},
    )


def write_token_lists(
    out_dir: str | os.PathLike,
    docs: Sequence[Sequence[int] | np.ndarray],
    *,
    seq_len: int,
    tokenizer: TokenizerIdentity | None = None,
    vocab_size: int | None = None,
    eos_id: int | None = None,
    loss_masks: Sequence[Sequence[int] | np.ndarray] | None = None,
    doc_ids: Sequence[str] | None = None,
    components: Sequence[str] | None = None,
    docs_per_shard: int | None = None,
    append_eos: bool = True,
) -> ShardManifest:
    """Write token lists as a shard set, in-process (no Spark, no tokenizer): for tests and toys.

    Each document gets EOS appended (as materialization does) unless `append_eos=False`; with
    `loss_masks`, EOS is a target (mask 1) when the document's last token is one. Give either a
    `tokenizer` identity or `vocab_size` + `eos_id` (a synthetic identity is recorded).
    """
    if tokenizer is None:
        if vocab_size is None or eos_id is None:
            raise ValueError("give tokenizer=TokenizerIdentity(...) or both vocab_size and eos_id")
        tokenizer = TokenizerIdentity.synthetic(vocab_size, eos_id)
    out = storage.path(out_dir)
    n = len(docs)
    per = docs_per_shard or max(n, 1)
    shards: list[ShardFile] = []
    with atomic.atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        for f, lo in enumerate(range(0, max(n, 1), per)):
            w = ShardFileWriter(tmp, f"shard-{f:05d}", token_dtype(tokenizer.vocab_size), segment=f"s{f:04d}",
                                with_mask=loss_masks is not None, vocab_size=tokenizer.vocab_size)
            for i in range(lo, min(lo + per, n)):
                toks = np.asarray(docs[i], dtype=np.int64)
                mask = None
                if loss_masks is not None:
                    mask = np.asarray(loss_masks[i], dtype=np.uint8)
                if append_eos:
                    toks = np.append(toks, tokenizer.eos_id)
                    if mask is not None:
                        mask = np.append(mask, mask[-1] if len(mask) else 0)
                w.add(toks, doc_id=doc_ids[i] if doc_ids is not None else str(i),
                      component=components[i] if components is not None else "", loss_mask=mask)
            shards.append(w.close())
        manifest = build_manifest(shards=shards, tokenizer=tokenizer, seq_len=seq_len, stream="tokens",
                                  job="mixtures.write_token_lists", kind="sft" if loss_masks is not None else "pretrain")
        manifest.write(tmp)
    return manifest


# ---- reader side: the validated view every consumer goes through ---------------------------------

def _identity_of(tokenizer: Any) -> TokenizerIdentity | str:
    if isinstance(tokenizer, (TokenizerIdentity, str)):
        return tokenizer
    ident = getattr(tokenizer, "identity", None)
    if isinstance(ident, TokenizerIdentity):
        return ident
    raise TypeError(f"expected a TokenizerIdentity, a tokenizer with .identity, or a digest string; got {type(tokenizer)}")


class ShardSet:
    """A validated, read-only view of a shard set: memory-mapped tokens, lazily loaded indexes.

    `open` checks the manifest, that every file exists with the recorded size, and (when given)
    that the tokenizer matches; `verify()` re-hashes every byte.
    """

    _INDEX_CACHE = 64

    def __init__(self, directory: Path, manifest: ShardManifest):
        self.directory = directory
        self.manifest = manifest
        self.dtype = manifest.token_dtype
        self.n_tokens = manifest.n_tokens
        sizes = np.array([s.n_tokens for s in manifest.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(sizes)])          # global token offset of each shard
        ndocs = np.array([s.n_docs for s in manifest.shards], dtype=np.int64)
        self.shard_doc_starts = np.concatenate([[0], np.cumsum(ndocs)])      # global ordinal of each shard's first doc
        self._tokens: dict[int, np.ndarray] = {}
        self._masks: dict[int, np.ndarray] = {}
        self._starts: OrderedDict[int, np.ndarray] = OrderedDict()
        self._checked: dict[int, tuple[int, bytearray]] = {}   # per shard: tokens per block, verified flags
        self._sums: dict[int, np.ndarray | None] = {}
        self.vocab_size = manifest.tokenizer.vocab_size

    @classmethod
    def open(cls, directory: str | os.PathLike, tokenizer: Any = None, verify_hashes: bool = False) -> "ShardSet":
        location, directory = directory, storage.local_copy(directory)   # an object-store set is staged, sha256-checked
        if not directory.is_dir():
            raise ShardError(directory, "shard set directory not found")
        if storage.is_remote(location) and not (directory / MANIFEST_NAME).is_file():
            record = storage.join(location, storage.COMMIT_NAME)
            raise ShardError(storage.join(location, MANIFEST_NAME),
                             f"missing: the commit record {record} does not list it (not a shard set, or a "
                             "damaged one)")
        manifest = ShardManifest.read(directory / MANIFEST_NAME)
        mpath = directory / MANIFEST_NAME
        if manifest.n_tokens != sum(s.n_tokens for s in manifest.shards):
            raise ShardError(mpath, "n_tokens differs from the sum over shards", field="n_tokens")
        itemsize = manifest.token_dtype.itemsize
        if manifest.token_dtype != token_dtype(manifest.tokenizer.vocab_size):
            raise ShardError(mpath, f"dtype {manifest.dtype} does not fit vocab_size {manifest.tokenizer.vocab_size}",
                             field="dtype")
        for s in manifest.shards:
            _check_size(directory / s.tokens_path, s.n_tokens * itemsize, s.name)
            _check_size(directory / s.index_path, s.index_n_bytes, s.name)
            if s.mask_path:
                _check_size(directory / s.mask_path, s.n_tokens, s.name)
        if tokenizer is not None:
            check_tokenizer(manifest, tokenizer, mpath)
        unchecked = [s.name for s in manifest.shards if s.block_bytes is None]
        if unchecked or not manifest.manifest_digest:
            warnings.warn(f"{directory}: written without block checksums or a manifest digest (an older "
                          f"shard set): only token ids are checked as it is read; run `python -m mixtures inspect "
                          f"{directory} --verify` to check every byte, or re-materialize it", stacklevel=2)
        shard_set = cls(directory, manifest)
        if verify_hashes:
            shard_set.verify()
        return shard_set

    # ---- integrity ----
    def verify(self) -> None:
        """Re-hash every file against the manifest; raises ShardError naming the first bad file."""
        for s in self.manifest.shards:
            for rel, want in ((s.tokens_path, s.sha256), (s.index_path, s.index_sha256), (s.mask_path, s.mask_sha256)):
                if rel is None:
                    continue
                got = sha256_file(self.directory / rel)
                if got != want:
                    raise ShardError(self.directory / rel,
                                     f"sha256 {got[:16]}… does not match the manifest's {want[:16]}… (corrupted shard)")
        for i, s in enumerate(self.manifest.shards):
            if s.n_tokens:
                self.check_blocks(i, 0, s.n_tokens)

    def _block_sums(self, i: int) -> np.ndarray | None:
        """The xxh3-64 of every block of shard i's token file, from its index's metadata."""
        if i not in self._sums:
            s = self.manifest.shards[i]
            sums = None
            if s.block_bytes is not None:
                path = self.directory / s.index_path
                try:
                    meta = pq.read_schema(path).metadata or {}
                except (pa.ArrowInvalid, OSError) as e:
                    raise ShardError(path, f"document index unreadable ({e})") from None
                if BLOCKS_KEY not in meta:
                    raise ShardError(path, f"has no block checksums ({BLOCKS_KEY.decode()}), the manifest says "
                                           "it has: the index was replaced; re-materialize the set")
                sums = np.frombuffer(bytes.fromhex(meta[BLOCKS_KEY].decode()), dtype="<u8")
                want = -(-s.n_bytes // s.block_bytes)
                if sums.size != want:
                    raise ShardError(path, f"has {sums.size} block checksums for {want} blocks of {s.tokens_path}")
            self._sums[i] = sums
        return self._sums[i]

    def check_blocks(self, i: int, lo: int, hi: int) -> None:
        """Verify, once each, the blocks of shard i that hold its tokens [lo, hi): the block's
        checksum (when the set has them) and every token id < vocab_size. Raises ShardError
        naming the token file and the byte offset. After the first touch a block costs one
        bytearray lookup per read (the per-window fast path)."""
        checked = self._checked.get(i)
        if checked is None:
            s = self.manifest.shards[i]
            per = (s.block_bytes or BLOCK_BYTES) // self.dtype.itemsize        # tokens per block
            checked = self._checked[i] = (per, bytearray(-(-s.n_tokens // per)))
        per, done = checked
        for b in range(lo // per, (hi - 1) // per + 1):
            if not done[b]:
                self._check_block(i, b, per)
                done[b] = 1

    def _check_block(self, i: int, b: int, per: int) -> None:
        s = self.manifest.shards[i]
        sums = self._block_sums(i)
        tokens = self.shard_tokens(i)
        path = self.directory / s.tokens_path
        block = tokens[b * per:(b + 1) * per]
        if sums is not None and xxhash.xxh3_64_intdigest(block) != int(sums[b]):
            raise ShardError(path, f"block {b} (bytes {b * per * self.dtype.itemsize}-"
                                   f"{(b * per + block.size) * self.dtype.itemsize - 1}) does not match its checksum: "
                                   "the file is corrupted; re-materialize the set")
        if block.size and int(block.max()) >= self.vocab_size:
            at = b * per + int(np.argmax(block >= self.vocab_size))
            raise ShardError(path, f"token id {int(tokens[at])} at token {at} (byte {at * self.dtype.itemsize}) "
                                   f"is outside the vocabulary of {self.vocab_size}: the file is corrupted")

    # ---- access ----
    @property
    def has_mask(self) -> bool:
        return any(s.mask_sha256 is not None for s in self.manifest.shards)

    def shard_tokens(self, i: int) -> np.ndarray:
        if i not in self._tokens:
            s = self.manifest.shards[i]
            path = self.directory / s.tokens_path
            self._tokens[i] = (np.memmap(path, dtype=self.dtype, mode="r", shape=(s.n_tokens,))
                               if s.n_tokens else np.zeros(0, dtype=self.dtype))
        return self._tokens[i]

    def release(self, i: int) -> None:
        """Unmap shard i's token and mask files (a sequential pass over a large set keeps one
        shard's pages resident instead of every shard's); the next access maps them again."""
        self._tokens.pop(i, None)
        self._masks.pop(i, None)

    def shard_mask(self, i: int) -> np.ndarray:
        s = self.manifest.shards[i]
        if s.mask_path is None:
            return np.ones(s.n_tokens, dtype=np.uint8)
        if i not in self._masks:
            path = self.directory / s.mask_path
            self._masks[i] = (np.memmap(path, dtype=np.uint8, mode="r", shape=(s.n_tokens,))
                              if s.n_tokens else np.zeros(0, dtype=np.uint8))
        return self._masks[i]

    def read_index(self, i: int, columns: list[str] | None = None) -> pa.Table:
        s = self.manifest.shards[i]
        path = self.directory / s.index_path
        try:
            table = pq.read_table(path, columns=columns)
        except (pa.ArrowInvalid, OSError) as e:
            raise ShardError(path, f"document index unreadable ({e})") from None
        if table.num_rows != s.n_docs:
            raise ShardError(path, f"has {table.num_rows} documents, the manifest says {s.n_docs}")
        return table

    def doc_starts(self, i: int) -> np.ndarray:
        """Token offsets (within shard i) where its documents start; validated on first load."""
        if i in self._starts:
            self._starts.move_to_end(i)
            return self._starts[i]
        s = self.manifest.shards[i]
        t = self.read_index(i, ["token_start", "n_tokens"])
        starts = t.column("token_start").to_numpy()
        lens = t.column("n_tokens").to_numpy()
        ok = (len(starts) == 0 and s.n_tokens == 0) or (
            len(starts) > 0 and starts[0] == 0 and np.all(lens > 0)
            and np.array_equal(starts[1:], starts[:-1] + lens[:-1]) and starts[-1] + lens[-1] == s.n_tokens)
        if not ok:
            raise ShardError(self.directory / s.index_path, "document offsets do not tile the shard's tokens")
        self._starts[i] = starts.astype(np.int64)
        if len(self._starts) > self._INDEX_CACHE:
            self._starts.popitem(last=False)
        return self._starts[i]

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Global tokens [start, stop): (tokens int64, loss mask uint8, global doc ordinal, global doc start)."""
        if not 0 <= start <= stop <= self.n_tokens:
            raise IndexError(f"token range [{start}, {stop}) outside the stream of {self.n_tokens} tokens")
        n = stop - start
        tokens = np.empty(n, dtype=np.int64)
        mask = np.empty(n, dtype=np.uint8)
        doc = np.empty(n, dtype=np.int64)
        doc_start = np.empty(n, dtype=np.int64)
        pos = start
        first = int(np.searchsorted(self.shard_starts, start, side="right")) - 1
        i = max(first, 0)
        while pos < stop:
            while self.shard_starts[i + 1] <= pos:   # skip empty shards
                i += 1
            base = int(self.shard_starts[i])
            lo, hi = pos - base, min(stop, int(self.shard_starts[i + 1])) - base
            out = slice(pos - start, pos - start + (hi - lo))
            self.check_blocks(i, lo, hi)
            tokens[out] = self.shard_tokens(i)[lo:hi]
            mask[out] = self.shard_mask(i)[lo:hi]
            starts = self.doc_starts(i)
            local = np.searchsorted(starts, np.arange(lo, hi), side="right") - 1
            doc[out] = local + self.shard_doc_starts[i]
            doc_start[out] = starts[local] + base
            pos = base + hi
            i += 1
        return tokens, mask, doc, doc_start


def _check_size(path: Path, want: int, shard: str) -> None:
    if not path.is_file():
        raise ShardError(path, f"file of shard {shard} is missing")
    got = path.stat().st_size
    if got != want:
        what = "truncated" if got < want else "longer than recorded"
        raise ShardError(path, f"is {got} bytes, the manifest says {want} ({what}; re-materialize the shard set)")


def check_tokenizer(manifest: ShardManifest, tokenizer: Any, where: object = "") -> None:
    """Refuse a shard set tokenized with something else than `tokenizer`."""
    ident = _identity_of(tokenizer)
    have = manifest.tokenizer
    digest = ident if isinstance(ident, str) else ident.digest
    if digest != have.digest:
        name = "" if isinstance(ident, str) else f" '{ident.name}' ({ident.kind}, vocab {ident.vocab_size})"
        raise TokenizerMismatch(where or "shard set",
                                f"was tokenized with '{have.name}' ({have.kind}, vocab {have.vocab_size}, digest "
                                f"{have.digest[:12]}…), not the given tokenizer{name} (digest {digest[:12]}…)",
                                field="tokenizer")
