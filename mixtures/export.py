"""Export a shard set for other trainers (issue 37): the set's token stream, in its order, in the
formats Megatron-LM, Hugging Face `datasets` and nanotron/datatrove read.

    python -m mixtures export SET --format megatron|hf|nanotron --out DIR

Every export holds the set's documents (tokens including their EOS) in stream order, exactly the
stream `ShardReader` cuts into windows: shards in manifest order, documents in index order, so
curriculum buckets, the phase transition and repetition come out as materialized. Each token
block is checked as `ShardReader` checks it (xxh3 per 1 MiB block, ids below the vocabulary)
before it is written. Layout of DIR (contract `export/1`):

    export.json            ExportRecord: format, the source set (path, set_digest, manifest
                           digest, seq_len, dtype, tokenizer digest), counts, every file with
                           its size and sha256, how to read it
    shards.manifest.json   the set's manifest.json, byte for byte (spec hash, tokenizer,
                           composition per bucket and segment): `ShardManifest.read` reads it
    megatron:  <set>.bin, <set>.idx          Megatron-LM's indexed dataset (MMIDIDX version 1):
               one sequence and one document entry per document; `--data-path DIR/<set>`
    hf:        data-KKKKK-of-NNNNN.arrow, dataset_info.json, state.json   `save_to_disk` layout
               (`datasets.load_from_disk(DIR)`), and parquet/train-KKKKK-of-NNNNN.parquet, one
               row per document: `input_ids` (list of uint16/uint32), plus `loss_mask` (list
               of uint8) for SFT sets
    nanotron:  <set>.ds, <set>.ds.index, <set>.ds.metadata   datatrove's tokenized format (the
               token stream, uint64 document ends, tokenizer|token size and token count), which
               nanotron's Nanoset and datatrove's DatatroveFolderDataset read

Memory stays flat: documents are streamed in chunks of at most `CHUNK_TOKENS` tokens, the
Megatron index is written in place at offsets known from the manifest's counts. The directory
appears atomically (`purokit.storage.atomic_path`: a rename locally, the commit record on an
object store), so a killed export leaves no partial DIR.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ConfigDict, Field

from purokit import atomic, storage
from purokit.config import StrictModel, load_contract
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from purokit.manifest import MANIFEST_NAME
from mixtures.megatron import MegatronWriter
from mixtures.shards import ShardSet

EXPORT_SCHEMA = "export/1"
EXPORT_RECORD = "export.json"
SET_MANIFEST_COPY = "shards.manifest.json"
FORMATS = ("megatron", "hf", "nanotron")
CHUNK_TOKENS = 1 << 23                  # tokens per write (16 MiB of uint16): bounds memory
HF_FILE_BYTES = 500 * 10**6             # `datasets`' default max_shard_size for save_to_disk


class ExportError(ContractError):
    """The export cannot be made: bad format, an existing output, a set the format cannot hold."""


class ExportFile(StrictModel):
    path: str
    n_bytes: int
    sha256: str


class ExportRecord(StrictModel):
    """Contract `export/1`: what an export directory holds and where it came from. Content only
    (no wall-clock time): the same set exported twice gives the same record."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: Literal["export/1"] = Field(default=EXPORT_SCHEMA, alias="schema")
    format: Literal["megatron", "hf", "nanotron"]
    source: str
    set_digest: str
    manifest_digest: str
    spec_hash: str | None
    tokenizer_digest: str
    kind: str
    seq_len: int
    dtype: str
    eos_id: int
    n_tokens: int
    n_docs: int
    files: list[ExportFile]
    read_with: str

    def to_json_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    @classmethod
    def read(cls, directory: str | os.PathLike) -> "ExportRecord":
        local = storage.local_copy(directory) if storage.is_remote(directory) else Path(directory)
        return load_contract(cls, local / EXPORT_RECORD, EXPORT_SCHEMA, "no export record: not an export directory")


# ---- the stream, in chunks of whole documents ---------------------------------------------------

def document_chunks(doc_lengths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive document ranges [lo, hi) of at most `max_tokens` tokens each (a longer single
    document is a range of its own)."""
    ends = np.cumsum(doc_lengths)
    out: list[tuple[int, int]] = []
    lo, base = 0, 0
    n = len(doc_lengths)
    while lo < n:
        hi = int(np.searchsorted(ends, base + max_tokens, side="right"))
        hi = max(hi, lo + 1)
        out.append((lo, hi))
        base = int(ends[hi - 1])
        lo = hi
    return out


def stream_chunks(shards: ShardSet, max_tokens: int = CHUNK_TOKENS
                  ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]]:
    """(shard index, tokens, document lengths, loss mask or None) of the whole set in stream order,
    in chunks of whole documents; each token block verified as `ShardReader` verifies it."""
    mask_needed = shards.has_mask
    for i, s in enumerate(shards.manifest.shards):
        if not s.n_tokens:
            continue
        starts = shards.doc_starts(i)
        lengths = np.diff(np.append(starts, s.n_tokens))
        tokens = shards.shard_tokens(i)
        for lo, hi in document_chunks(lengths, max_tokens):
            t0 = int(starts[lo])
            t1 = int(starts[hi]) if hi < len(starts) else s.n_tokens
            shards.check_blocks(i, t0, t1)
            mask = np.asarray(shards.shard_mask(i)[t0:t1]) if mask_needed else None
            yield i, np.asarray(tokens[t0:t1]), lengths[lo:hi], mask
        del tokens
        shards.release(i)


# ---- Hugging Face datasets: save_to_disk layout + parquet ---------------------------------------

def plan_files(shard_bytes: list[int], target_bytes: int) -> list[int]:
    """Output file number of each source shard: consecutive shards share a file until it holds
    at least `target_bytes` (documents never straddle files; empty shards join the current one)."""
    out, k, fill = [], 0, 0
    for b in shard_bytes:
        if fill >= target_bytes and b:
            k, fill = k + 1, 0
        out.append(k)
        fill += b
    return out


def hf_features(dtype: str, with_mask: bool):
    """The `datasets.Features` of an export: input_ids (and loss_mask) as lists of integers."""
    import datasets

    cols = {"input_ids": datasets.List(datasets.Value(dtype))}
    if with_mask:
        cols["loss_mask"] = datasets.List(datasets.Value("uint8"))
    return datasets.Features(cols)


class HfWriter:
    """Arrow stream files (what `save_to_disk` writes and `load_from_disk` memory-maps) and
    parquet files with the same rows, plus `dataset_info.json` and `state.json`."""

    def __init__(self, directory: Path, prefix: str, shards: ShardSet):
        m = shards.manifest
        self.directory = directory
        self.features = hf_features(m.dtype, shards.has_mask)
        self.schema = self.features.arrow_schema
        self.file_of = plan_files([s.n_bytes for s in m.shards], HF_FILE_BYTES)
        self.n_files = self.file_of[-1] + 1 if self.file_of else 1
        (directory / "parquet").mkdir()
        self.current, self.arrow, self.parquet = -1, None, None
        self.names: list[str] = []
        self.fingerprint = m.set_digest[:16]

    def _open(self, k: int) -> None:
        self._close_files()
        arrow_name = f"data-{k:05d}-of-{self.n_files:05d}.arrow"
        parquet_name = f"parquet/train-{k:05d}-of-{self.n_files:05d}.parquet"
        self.arrow = pa.ipc.new_stream(str(self.directory / arrow_name), self.schema)
        self.parquet = pq.ParquetWriter(self.directory / parquet_name, self.schema, compression="none",
                                        use_dictionary=False, write_statistics=False)
        self.names += [arrow_name, parquet_name]
        self.current = k

    def _close_files(self) -> None:
        if self.arrow is not None:
            self.arrow.close()
            self.parquet.close()

    def start_shard(self, i: int) -> None:
        if self.file_of[i] != self.current:
            self._open(self.file_of[i])

    def add(self, tokens: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None) -> None:
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        cols = [pa.ListArray.from_arrays(offsets, pa.array(tokens))]
        if mask is not None:
            cols.append(pa.ListArray.from_arrays(offsets, pa.array(mask)))
        batch = pa.RecordBatch.from_arrays(cols, schema=self.schema)
        self.arrow.write_batch(batch)
        self.parquet.write_batch(batch)

    def close(self) -> list[str]:
        if self.current < 0:                        # an empty set: one empty file of each kind
            self._open(0)
        self._close_files()
        info = {"citation": "", "description": "", "features": self.features.to_dict(), "homepage": "", "license": ""}
        state = {"_data_files": [{"filename": n} for n in self.names if n.endswith(".arrow")],
                 "_fingerprint": self.fingerprint, "_format_columns": None, "_format_kwargs": {},
                 "_format_type": None, "_output_all_columns": False, "_split": None}
        for name, obj in (("dataset_info.json", info), ("state.json", state)):
            (self.directory / name).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
        return self.names + ["dataset_info.json", "state.json"]


# ---- nanotron / datatrove tokenized files ------------------------------------------------------

class NanotronWriter:
    """`<prefix>.ds` (the token stream), `<prefix>.ds.index` (uint64 end of every document) and
    `<prefix>.ds.metadata` ("<tokenizer>|<token size>", token count, humanized count)."""

    def __init__(self, directory: Path, prefix: str, shards: ShardSet):
        self.prefix, self.manifest, self.itemsize = prefix, shards.manifest, shards.dtype.itemsize
        self.ds = open(directory / f"{prefix}.ds", "wb")
        self.index = open(directory / f"{prefix}.ds.index", "wb")
        self.directory, self.n_tokens = directory, 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None) -> None:
        self.ds.write(memoryview(np.ascontiguousarray(tokens)).cast("B"))
        self.index.write((self.n_tokens + np.cumsum(lengths)).astype("<u8").tobytes())
        self.n_tokens += int(tokens.size)

    def close(self) -> list[str]:
        self.ds.close()
        self.index.close()
        name = self.manifest.tokenizer.name
        (self.directory / f"{self.prefix}.ds.metadata").write_text(
            f"{name}|{self.itemsize}\n{self.n_tokens}\n{self.n_tokens / 1e9:.2f}BT")
        return [f"{self.prefix}.ds", f"{self.prefix}.ds.index", f"{self.prefix}.ds.metadata"]


WRITERS = {"megatron": MegatronWriter, "hf": HfWriter, "nanotron": NanotronWriter}
READ_WITH = {
    "megatron": "Megatron-LM: --data-path {out}/{prefix} --split 100,0,0 --seq-length {seq_len} "
                "(megatron.core.datasets.indexed_dataset.IndexedDataset('{out}/{prefix}'))",
    "hf": "datasets.load_from_disk('{out}') or load_dataset('parquet', data_files='{out}/parquet/*.parquet')",
    "nanotron": "datatrove.utils.dataset.DatatroveFolderDataset('{out}', seq_len={seq_len}, token_size={itemsize}) "
                "/ nanotron Nanoset dataset_folder {out}",
}


# ---- the command ---------------------------------------------------------------------------------

def check_request(set_path: str, fmt: str, out: str) -> None:
    """Refuse an unknown format or an existing output before any work."""
    if fmt not in FORMATS:
        raise ExportError(set_path, f"unknown export format {fmt!r} (formats: {', '.join(FORMATS)})", field="--format")
    if storage.exists(out):
        raise ExportError(out, "already exists; remove it or choose another --out (an export never overwrites)")


def export_set(set_path: str | os.PathLike, fmt: str, out: str | os.PathLike,
               progress: Callable[[str], None] = print) -> ExportRecord:
    """Write the shard set at `set_path` (local or a URL) as `fmt` into the new directory `out`."""
    set_path, out = str(set_path), str(out)
    check_request(set_path, fmt, out)
    shards = ShardSet.open(set_path)
    m = shards.manifest
    if m.kind == "sft" and fmt != "hf":
        raise ExportError(set_path, f"is an SFT set: its assistant-only loss masks have no place in the {fmt} "
                                    "format; export it with --format hf (a loss_mask column)", field="kind")
    prefix = storage.path(set_path).name or "tokens"
    with storage.atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        writer = WRITERS[fmt](tmp, prefix, shards)
        done, step = 0, max(m.n_tokens // 10, 1)
        for i, tokens, lengths, mask in stream_chunks(shards):
            if hasattr(writer, "start_shard"):
                writer.start_shard(i)
            writer.add(tokens, lengths, mask)
            if (done + tokens.size) // step > done // step:
                progress(f"export {fmt}: {done + tokens.size:,} / {m.n_tokens:,} tokens")
            done += tokens.size
        names = writer.close()
        (tmp / SET_MANIFEST_COPY).write_bytes((shards.directory / MANIFEST_NAME).read_bytes())
        names.append(SET_MANIFEST_COPY)
        record = ExportRecord(
            format=fmt, source=set_path, set_digest=m.set_digest, manifest_digest=m.manifest_digest,
            spec_hash=m.spec_hash, tokenizer_digest=m.tokenizer.digest, kind=m.kind, seq_len=m.seq_len,
            dtype=m.dtype, eos_id=m.eos_id, n_tokens=m.n_tokens, n_docs=m.n_docs,
            files=[ExportFile(path=n, n_bytes=(tmp / n).stat().st_size, sha256=sha256_file(tmp / n)) for n in sorted(names)],
            read_with=READ_WITH[fmt].format(out=out, prefix=prefix, seq_len=m.seq_len, itemsize=shards.dtype.itemsize))
        atomic.write_json(tmp / EXPORT_RECORD, record.to_json_dict())
    progress(f"exported {prefix}: {m.n_tokens:,} tokens, {m.n_docs:,} documents as {fmt} -> {out}")
    return record



def is_megatron_export(prefix: str) -> bool:
    """Whether Megatron dataset prefix `prefix` is the `<set>` of one of our megatron exports."""
    record = Path(prefix).parent / EXPORT_RECORD
    return record.is_file() and ExportRecord.read(record.parent).format == "megatron"
