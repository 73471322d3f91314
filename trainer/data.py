"""What the training loop eats: per-rank micro-batches of (inputs, targets, loss mask, documents).

Shard sets are read ONLY through the mixtures package's reader (`mixtures.reader`); this module
adapts its batches to tensors. The synthetic stream is a learnable token source for tests and
benchmarks that need no shards (a seeded sparse Markov chain with EOS-separated documents), and it
resumes exactly from a sequence index like the reader does from a token offset.

Every stream hands out whole *global* batches: `next_global_batch()` returns this rank's share, cut
into micro-batches, and `state()` is a rank-independent cursor (the position of the next global
batch in the stream), which is what a checkpoint records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

EOS_SYNTHETIC = 0


@dataclass
class MicroBatch:
    inputs: torch.Tensor                 # (B, T) int64
    targets: torch.Tensor                # (B, T) int64
    loss_mask: torch.Tensor | None       # (B, T) float32, 1 where the target counts (SFT); None: all
    doc_ids: torch.Tensor | None         # (B, T) int64, constant within a packed document
    positions: torch.Tensor | None       # (B, T) int64, rotary positions restarting per document

    def to(self, device: torch.device) -> "MicroBatch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return MicroBatch(move(self.inputs), move(self.targets), move(self.loss_mask), move(self.doc_ids),
                          move(self.positions))

    def pin(self) -> "MicroBatch":
        """The same batch in page-locked memory (asynchronous host-to-GPU copies)."""
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return MicroBatch(pin(self.inputs), pin(self.targets), pin(self.loss_mask), pin(self.doc_ids),
                          pin(self.positions))

    @property
    def n_loss_tokens(self) -> int:
        return int(self.targets.numel() if self.loss_mask is None else self.loss_mask.sum().item())


class TokenStream(Protocol):
    seq_len: int
    vocab_size: int

    def next_global_batch(self) -> list[MicroBatch]: ...

    def state(self) -> dict[str, Any]: ...

    def steps_left(self) -> int | None:
        """Global batches left before the stream runs out (None: it never does)."""
        ...


def doc_ids_from_eos(inputs: np.ndarray, eos_id: int) -> np.ndarray:
    """Document index per position: a new document starts after each EOS (EOS ends its document)."""
    is_eos = (inputs == eos_id).astype(np.int64)
    return np.cumsum(is_eos, axis=-1) - is_eos


def positions_from_doc_ids(doc_ids: np.ndarray) -> np.ndarray:
    """Position within the document: t minus the index where the document started."""
    B, T = doc_ids.shape
    t = np.broadcast_to(np.arange(T), (B, T))
    starts = np.concatenate([np.ones((B, 1), dtype=bool), doc_ids[:, 1:] != doc_ids[:, :-1]], axis=1)
    start_idx = np.maximum.accumulate(np.where(starts, t, 0), axis=1)
    return t - start_idx


def check_micro_batching(global_batch: int, micro_batch: int, world: int) -> None:
    """A global batch must split into whole micro-batches on every rank."""
    if global_batch % (micro_batch * world):
        raise ValueError(f"train.global_batch ({global_batch}) must be a multiple of "
                         f"micro_batch x ranks ({micro_batch} x {world})")


def rank_share(global_batch: int, micro_batch: int, rank: int, world: int) -> tuple[int, int]:
    """This rank's [start, stop) within a global batch of sequences, and the check that it divides."""
    check_micro_batching(global_batch, micro_batch, world)
    per_rank = global_batch // world
    return rank * per_rank, (rank + 1) * per_rank


def cut_micro_batches(micro_batch: int, inputs: np.ndarray, targets: np.ndarray, loss_mask: np.ndarray | None = None,
                      doc_ids: np.ndarray | None = None, positions: np.ndarray | None = None) -> list[MicroBatch]:
    """A rank's rows of a global batch, (n, T) arrays each, cut into micro-batches of `micro_batch` rows
    (every stream's one cutter; the arrays keep their dtypes)."""
    def rows(a: np.ndarray | None, i: int) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a[i:i + micro_batch]))

    return [MicroBatch(rows(inputs, i), rows(targets, i), rows(loss_mask, i), rows(doc_ids, i), rows(positions, i))
            for i in range(0, inputs.shape[0], micro_batch)]


class SyntheticStream:
    """Sequence i of the stream is a pure function of (seed, i): resumable, rank-independent."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int, global_batch: int, micro_batch: int,
                 rank: int = 0, world: int = 1, branching: int = 4, mean_doc_tokens: int = 48,
                 next_sequence: int = 0, with_documents: bool = False, with_positions: bool = False,
                 sample_seed: int | None = None):
        if vocab_size < 2 * branching:
            raise ValueError("synthetic vocab_size too small")
        # `seed` fixes the language (the transition table); `sample_seed` which sequences are drawn
        # from it (a held-out stream shares the language, not the samples)
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.sample_seed = seed if sample_seed is None else sample_seed
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.start, self.stop = rank_share(global_batch, micro_batch, rank, world)
        self.mean_doc_tokens = mean_doc_tokens
        self.next_sequence = next_sequence
        self.with_documents, self.with_positions = with_documents, with_positions
        table_rng = np.random.default_rng([seed, 0x7AB1E])
        self.table = table_rng.integers(1, vocab_size, size=(vocab_size, branching))
        p = 0.5 ** np.arange(branching)
        self.cum_p = np.cumsum(p / p.sum())

    def sequences(self, first: int, n: int) -> np.ndarray:
        """Sequences first .. first+n-1, each of seq_len + 1 tokens."""
        T = self.seq_len + 1
        out = np.empty((n, T), dtype=np.int64)
        for j in range(n):
            rng = np.random.default_rng([self.sample_seed, first + j])
            u = rng.random(T)
            starts = rng.integers(1, self.vocab_size, size=T)
            eos = rng.random(T) < 1.0 / self.mean_doc_tokens
            choice = np.searchsorted(self.cum_p, u)
            tok = starts[0]
            for t in range(T):
                out[j, t] = tok
                if tok == EOS_SYNTHETIC:
                    tok = starts[t]
                elif eos[t]:
                    tok = EOS_SYNTHETIC
                else:
                    tok = self.table[tok, min(choice[t], self.table.shape[1] - 1)]
        return out

    def next_global_batch(self) -> list[MicroBatch]:
        base = self.next_sequence
        windows = self.sequences(base + self.start, self.stop - self.start)
        self.next_sequence = base + self.global_batch
        doc_ids = doc_ids_from_eos(windows[:, :-1], EOS_SYNTHETIC) if self.with_documents else None
        positions = positions_from_doc_ids(doc_ids) if doc_ids is not None and self.with_positions else None
        return cut_micro_batches(self.micro_batch, windows[:, :-1], windows[:, 1:], None, doc_ids, positions)

    def steps_left(self) -> int | None:
        """The synthetic stream never runs out."""
        return None

    def state(self) -> dict[str, Any]:
        return {"kind": "synthetic", "seed": self.seed, "sample_seed": self.sample_seed,
                "next_sequence": self.next_sequence}

    @property
    def tokens_per_global_batch(self) -> int:
        return self.global_batch * self.seq_len
