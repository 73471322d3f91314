"""Shard sets through the mixtures reader (the only reader): batches -> `MicroBatch` tensors.

`ShardStream` wraps `mixtures.ShardReader` (sequential, exact resume from its global cursor, data-
parallel split); `eval_micro_batches` wraps `mixtures.EvalReader` (a fixed held-out set, every target
once, padding masked). Nothing here opens a shard file itself. A shard set on an object store
(`data.train: s3://...`) is staged into the local cache by `ShardSet.open` (`purokit.storage.local_copy`:
every file checked against the commit record's sha256) and memory-mapped from there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from purokit import storage
from purokit.errors import ContractError
from purokit.hashing import sha256_file
from trainer.data import MicroBatch, check_micro_batching, cut_micro_batches


class DataExhausted(RuntimeError):
    pass


def _tokenizer_arg(tokenizer: str | None):
    """A tokenizer path -> the mixtures Tokenizer (the reader compares its identity digest)."""
    if tokenizer is None:
        return None
    from mixtures.tokenizers import load_tokenizer
    return load_tokenizer(tokenizer)


def micro_batches(batch: dict[str, np.ndarray], micro_batch: int, use_mask: bool, with_documents: bool,
                  with_positions: bool) -> list[MicroBatch]:
    """A reader batch's arrays (the ones this run uses) through the one cutter."""
    mask = batch["loss_mask"].astype(np.float32) if use_mask else None
    return cut_micro_batches(micro_batch, batch["input_ids"], batch["labels"], mask,
                             batch["doc_ids"] if with_documents else None,
                             batch["position_ids"] if with_positions else None)


class ShardStream:
    """This rank's micro-batches of each global batch of a shard set, with the reader's cursor."""

    def __init__(self, path: str | os.PathLike, *, global_batch: int, micro_batch: int, rank: int = 0, world: int = 1,
                 cursor: dict[str, Any] | None = None, sft: bool = False, with_documents: bool = False,
                 with_positions: bool = False, verify_hashes: bool = False, tokenizer: str | None = None,
                 seq_len: int | None = None, loop: bool = False):
        from mixtures import ShardReader

        check_micro_batching(global_batch, micro_batch, world)
        self.path = storage.path(path)
        self.reader = ShardReader(path, global_batch_size=global_batch, seq_len=seq_len, rank=rank, world_size=world,
                                  tokenizer=_tokenizer_arg(tokenizer), verify_hashes=verify_hashes, loop=loop)
        manifest = self.reader.manifest
        if sft and manifest.kind != "sft":
            raise ContractError(self.path / "manifest.json", f"objective is sft but this shard set is kind "
                                f"'{manifest.kind}' (no loss masks): materialize SFT shards", field="kind")
        if cursor:
            self.reader.load_state_dict(cursor)
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.seq_len = self.reader.seq_len
        self.vocab_size = manifest.tokenizer.vocab_size
        self.sft, self.with_documents, self.with_positions = sft, with_documents, with_positions
        self.loop = loop

    def steps_left(self) -> int | None:
        """Global steps left before the stream runs out (None when looping)."""
        if self.loop:
            return None
        return self.reader.steps_per_epoch - self.reader.token_offset // self.reader.tokens_per_step

    def next_global_batch(self) -> list[MicroBatch]:
        try:
            batch = self.reader.next_batch()
        except StopIteration:
            raise DataExhausted(f"{self.path}: the shard set is exhausted after {self.reader.steps_per_epoch} steps "
                                f"of {self.reader.tokens_per_step} tokens (set data.loop: true to repeat it)") from None
        use_mask = self.sft or not bool(batch["loss_mask"].all())
        return micro_batches(batch, self.micro_batch, use_mask, self.with_documents, self.with_positions)

    def state(self) -> dict[str, Any]:
        return self.reader.state_dict()


def eval_micro_batches(path: str | os.PathLike, *, micro_batch: int, rank: int, world: int, max_windows: int,
                       with_documents: bool, with_positions: bool, tokenizer: str | None = None,
                       seq_len: int | None = None) -> Iterator[MicroBatch]:
    """The held-out set's batches for this rank (the same windows every call; padding masked)."""
    from mixtures import EvalReader

    ev = EvalReader(path, batch_size=micro_batch, seq_len=seq_len, rank=rank, world_size=world,
                    tokenizer=_tokenizer_arg(tokenizer), max_windows=max_windows)
    for batch in ev:
        yield from micro_batches(batch, micro_batch, True, with_documents, with_positions)


def shard_set_tokenizer(path: str | os.PathLike) -> tuple[Path | None, str | None]:
    """The tokenizer files of a shard set, for export: a `tokenizer.json` stored in the shard set
    directory, its `tokenizer/` subdirectory or its parent, whose sha256 matches the manifest's
    tokenizer identity. Returns (directory or file, eos token) or (None, None)."""
    from mixtures import ShardSet

    shard_set = ShardSet.open(path)
    ident = shard_set.manifest.tokenizer
    want = ident.files.get("tokenizer.json")
    if want is None:
        return None, None
    base = shard_set.directory          # the staged copy of an object-store set
    for cand in (base / "tokenizer.json", base / "tokenizer" / "tokenizer.json", base.parent / "tokenizer" / "tokenizer.json",
                 base.parent / "tokenizer.json"):
        if cand.is_file() and sha256_file(cand) == want:
            eos = _eos_token(cand, ident.eos_id)
            return (cand.parent if (cand.parent / "tokenizer_config.json").is_file() else cand), eos
    return None, None


def _eos_token(tokenizer_json: Path, eos_id: int) -> str | None:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(tokenizer_json)).id_to_token(eos_id)


def check_tokenizer_file(tokenizer: str | os.PathLike, shard_dir: str | os.PathLike) -> tuple[Path, str | None]:
    """Refuse to export with a tokenizer other than the one the shards were made with."""
    from mixtures import ShardSet

    ident = ShardSet.open(shard_dir).manifest.tokenizer
    p = Path(tokenizer)
    tj = p / "tokenizer.json" if p.is_dir() else p
    want = ident.files.get("tokenizer.json")
    if want is not None and tj.is_file() and sha256_file(tj) != want:
        raise ContractError(tj, f"is not the tokenizer the shard set {shard_dir} was made with "
                                f"({ident.name}, tokenizer.json sha256 {want[:12]}…)")
    return p, _eos_token(tj, ident.eos_id) if tj.is_file() else None
