"""Megatron-LM's indexed dataset (`.bin` + `.idx`, MMIDIDX version 1), and keeping our order in it.

The `.idx` file (megatron/core/datasets/indexed_dataset.py, `_IndexWriter` / `_IndexReader`):

    b"MMIDIDX\\x00\\x00"   9 bytes    magic
    <Q 1                  8 bytes    version
    <B code               1 byte     token dtype (uint16 = 8, int32 = 4, ...)
    <Q n                  8 bytes    sequence count
    <Q m                  8 bytes    document-index length (documents + 1)
    int32[n]                         tokens per sequence
    int64[n]                         byte offset of each sequence in `.bin`
    int64[m]                         document index: sequence ranges [d_i, d_i+1) of each document

An export writes one sequence and one document per document of the shard set (tokens incl. EOS),
so the `.bin` is the set's token stream byte for byte.

Megatron's GPTDataset (megatron-core 0.16) permutes both the document order and the sample order
with `--seed`, and no flag turns that off; it caches the permutations as `.npy` files under
`--data-cache-path` and reuses them when they exist. `keep_order(cache_dir)` rewrites the cached
indices of our exports to the identity: document i of the export, in order, cut into samples of
`seq_length + 1` tokens that advance by `seq_length` from token 0, sample i at step position i.
That is `ShardReader`'s window order (through the first epoch; after it Megatron continues the
stream where ShardReader starts the set again at token 0).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from purokit.errors import ContractError

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
# Megatron-Core's DType codes. It has no uint32: ids of a uint32 set are < 2^31, so its bytes are
# the same little-endian int32 values.
DTYPE_CODES = {"uint16": 8, "uint32": 4}
CODE_DTYPES = {8: np.dtype("<u2"), 4: np.dtype("<i4")}
CACHE_ARRAYS = ("document_index", "sample_index", "shuffle_index")


def index_header(dtype: str, n_sequences: int) -> bytes:
    """The `.idx` header for one document per sequence (document index of n + 1 entries)."""
    return (HEADER + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODES[dtype])
            + struct.pack("<Q", n_sequences) + struct.pack("<Q", n_sequences + 1))


class MegatronWriter:
    """`<prefix>.bin` (the tokens) and `<prefix>.idx`. The section offsets of the index follow from
    the manifest's document count, so each chunk's lengths and pointers are written in place as
    the stream goes by: memory stays flat at any size."""

    def __init__(self, directory: Path, prefix: str, shards) -> None:
        m = shards.manifest
        self.prefix, self.n_docs, self.itemsize = prefix, m.n_docs, shards.dtype.itemsize
        self.bin = open(directory / f"{prefix}.bin", "wb")
        self.idx = open(directory / f"{prefix}.idx", "wb")
        header = index_header(m.dtype, m.n_docs)
        self.idx.write(header)
        self.lengths_at = len(header)
        self.pointers_at = self.lengths_at + 4 * m.n_docs
        self.doc_index_at = self.pointers_at + 8 * m.n_docs
        self.n_written, self.byte_pos = 0, 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None) -> None:
        if int(lengths.max()) > np.iinfo(np.int32).max:
            raise ContractError(f"{self.prefix}.idx", f"a document of {int(lengths.max())} tokens does not fit "
                                                       "Megatron's int32 sequence lengths")
        self.bin.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))
        pointers = self.byte_pos + self.itemsize * np.concatenate([[0], np.cumsum(lengths[:-1])])
        self.idx.seek(self.lengths_at + 4 * self.n_written)
        self.idx.write(lengths.astype("<i4").tobytes())
        self.idx.seek(self.pointers_at + 8 * self.n_written)
        self.idx.write(pointers.astype("<i8").tobytes())
        self.n_written += len(lengths)
        self.byte_pos += tokens.nbytes

    def close(self) -> list[str]:
        if self.n_written != self.n_docs:
            raise ContractError(f"{self.prefix}.idx", f"wrote {self.n_written} documents, the manifest says {self.n_docs}")
        self.idx.seek(self.doc_index_at)
        step = 1 << 22
        for lo in range(0, self.n_docs + 1, step):
            self.idx.write(np.arange(lo, min(lo + step, self.n_docs + 1), dtype="<i8").tobytes())
        self.bin.close()
        self.idx.close()
        return [f"{self.prefix}.bin", f"{self.prefix}.idx"]


def read_index(prefix: str | os.PathLike) -> tuple[np.dtype, np.ndarray, np.ndarray, np.ndarray]:
    """(token dtype, sequence lengths, byte pointers, document index) of `<prefix>.idx`."""
    path = Path(f"{prefix}.idx")
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    except FileNotFoundError:
        raise ContractError(path, "Megatron index not found") from None
    if bytes(raw[:9]) != HEADER or struct.unpack("<Q", bytes(raw[9:17]))[0] != VERSION:
        raise ContractError(path, "not a Megatron MMIDIDX version 1 index")
    code = int(raw[17])
    n, m = struct.unpack("<QQ", bytes(raw[18:34]))
    lengths = np.frombuffer(raw, dtype="<i4", count=n, offset=34)
    pointers = np.frombuffer(raw, dtype="<i8", count=n, offset=34 + 4 * n)
    doc_index = np.frombuffer(raw, dtype="<i8", count=m, offset=34 + 12 * n)
    return CODE_DTYPES[code], lengths, pointers, doc_index


def identity_indices(doc_lengths: np.ndarray, documents: np.ndarray, n_epochs: int, n_samples: int,
                     seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTDataset's three indices without any shuffle: the documents in order (`n_epochs` times),
    sample i starting at token i * seq_length of that stream, and the identity sample order.

    `sample_index[i]` is (position in the document index, token offset in that document) of the
    start of sample i, with `n_samples + 1` rows (the last marks the end), the convention of
    Megatron's `build_sample_idx`: a start on a document boundary is the previous document's end."""
    document_index = np.tile(documents.astype(np.int32), n_epochs)
    lengths = doc_lengths[document_index].astype(np.int64)
    ends = np.cumsum(lengths)
    starts = np.arange(n_samples + 1, dtype=np.int64) * seq_length
    position = np.searchsorted(ends, starts, side="left")
    position[starts == 0] = 0
    offset = starts - (ends[position] - lengths[position])
    sample_index = np.stack([position, offset], axis=1).astype(np.int64)
    return document_index, sample_index, np.arange(n_samples, dtype=np.int64)


def _cache_entries(cache_dir: Path) -> list[tuple[Path, dict]]:
    """(description file, its JSON) of every GPTDataset index cached under `cache_dir`."""
    out = []
    for desc in sorted(cache_dir.rglob("*-GPTDataset-*-description.txt")):
        try:
            out.append((desc, json.loads(desc.read_text())))
        except json.JSONDecodeError as e:
            raise ContractError(desc, f"not a Megatron index description ({e})") from None
    return out


def keep_order(cache_dir: str | os.PathLike, is_ours: Callable[[str], bool],
               progress: Callable[[str], None] = print) -> list[Path]:
    """Rewrite the cached GPTDataset indices of every dataset `is_ours(dataset_path)` accepts to
    our order (`identity_indices`), keeping the documents, epochs and sample count Megatron chose
    (its split and `--train-iters`). Each `.npy` is replaced atomically. Returns the descriptions
    rewritten."""
    cache = Path(cache_dir)
    if not cache.is_dir():
        raise ContractError(cache, "Megatron index cache directory not found (run Megatron once with "
                                   "--data-cache-path pointing here, so it builds its indices)")
    done = []
    for desc, info in _cache_entries(cache):
        prefix = info.get("dataset_path")
        if not prefix or not is_ours(prefix):
            progress(f"skip {desc.name}: {prefix} is not a purokit export")
            continue
        base = str(desc)[: -len("description.txt")]
        old_docs = np.load(base + "document_index.npy", mmap_mode="r")
        n_samples = np.load(base + "sample_index.npy", mmap_mode="r").shape[0] - 1
        documents = np.unique(old_docs)
        n_epochs = len(old_docs) // max(len(documents), 1)
        _, lengths, _, _ = read_index(prefix)
        arrays = identity_indices(lengths, documents, n_epochs, n_samples, int(info["sequence_length"]))
        for name, array in zip(CACHE_ARRAYS, arrays):
            tmp = Path(base + f"{name}.tmp.npy")
            np.save(tmp, array, allow_pickle=False)
            os.replace(tmp, base + f"{name}.npy")
        progress(f"{desc.name}: {len(documents):,} documents x {n_epochs} epoch(s), {n_samples:,} samples of "
                 f"{info['sequence_length']} tokens, now in the export's order")
        done.append(desc)
    return done
