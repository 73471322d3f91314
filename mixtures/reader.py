"""THE shard reader: the only way the trainer (and anything else) reads training tokens.

Sequential, memory-mapped, no online sampling (Puro §3.6.2). The stream of a shard set is cut into
windows of `seq_len + 1` tokens that advance by `seq_len` (the last token of one window's inputs
is the first target of the next), so every token after the first is a target exactly once and
the global position after step s is exactly `s * global_batch_size * seq_len` (Puro testable
behaviour 15: at 4096 x 1536 that is s x 6,291,456).

A global batch is `global_batch_size` consecutive windows; data-parallel rank r of W takes the
r-th contiguous block of `global_batch_size / W` of them. The cursor is global (a token offset
plus an epoch), so a run resumed with a different world size still sees the same global batches.

A batch is a dict of numpy arrays of shape (B, seq_len):
    input_ids     int64   tokens t .. t+L-1 of each window
    labels        int64   tokens t+1 .. t+L (the next-token targets; not masked, see loss_mask)
    loss_mask     bool    True where the label is a training target: everywhere for pretraining,
                          assistant tokens for SFT, False on eval padding
    position_ids  int64   position inside the document, restarting at every document start and
                          at the window start (for RoPE under document masking)
    doc_ids       int64   global ordinal of the document each input token belongs to (attention
                          may be restricted to equal doc_ids: document masking)
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from mixtures.shards import ShardError, ShardSet

CURSOR_SCHEMA = "shard-cursor/1"
BATCH_KEYS = ("input_ids", "labels", "loss_mask", "position_ids", "doc_ids")


def _window_batch(shard_set: ShardSet, starts: list[int], seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Read windows [s, s+seq_len+1) for each start s; a window cut by the end of the stream is
    padded with `pad_id` and masked out."""
    b = len(starts)
    inputs = np.full((b, seq_len), pad_id, dtype=np.int64)
    labels = np.full((b, seq_len), pad_id, dtype=np.int64)
    loss = np.zeros((b, seq_len), dtype=bool)
    positions = np.zeros((b, seq_len), dtype=np.int64)
    docs = np.full((b, seq_len), -1, dtype=np.int64)
    n = shard_set.n_tokens
    for row, s in enumerate(starts):
        stop = min(s + seq_len + 1, n)
        if stop - s < 2:
            continue
        tokens, mask, doc, doc_start = shard_set.read(s, stop)
        m = stop - s - 1                      # number of (input, target) pairs in this window
        inputs[row, :m] = tokens[:m]
        labels[row, :m] = tokens[1:m + 1]
        loss[row, :m] = mask[1:m + 1].astype(bool)
        docs[row, :m] = doc[:m]
        positions[row, :m] = np.arange(s, s + m) - np.maximum(doc_start[:m], s)
    return {"input_ids": inputs, "labels": labels, "loss_mask": loss, "position_ids": positions, "doc_ids": docs}


class ShardReader:
    """Training iterator over one shard set for one data-parallel rank.

    Args:
        path: the shard set directory (with manifest.json).
        global_batch_size: windows per optimizer step, over all ranks (must divide by world_size).
        seq_len: window length; defaults to the manifest's. Any length reads the same stream.
        rank, world_size: this process's data-parallel coordinates.
        tokenizer: a TokenizerIdentity, an object with `.identity` (mixtures.tokenizers.Tokenizer),
            or a digest string; the reader refuses a shard set tokenized with something else.
        verify_hashes: re-hash every file on open (sizes are always checked).
        loop: start over (next epoch, same order) when fewer tokens than one global batch remain;
            otherwise iteration stops there.
    """

    def __init__(self, path: str | os.PathLike, *, global_batch_size: int, seq_len: int | None = None,
                 rank: int = 0, world_size: int = 1, tokenizer: Any = None, verify_hashes: bool = False,
                 loop: bool = False):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if global_batch_size < 1 or global_batch_size % world_size:
            raise ValueError(f"global_batch_size {global_batch_size} must be a positive multiple of world_size {world_size}")
        self.shards = ShardSet.open(path, tokenizer=tokenizer, verify_hashes=verify_hashes)
        self.manifest = self.shards.manifest
        self.seq_len = int(seq_len or self.manifest.seq_len)
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {self.seq_len}")
        if self.manifest.kind == "sft" and self.seq_len != self.manifest.seq_len:
            raise ValueError(f"{path}: SFT conversations are packed whole into windows of {self.manifest.seq_len} "
                             f"tokens; reading them with seq_len {self.seq_len} would cut them (re-pack instead)")
        self.global_batch_size = global_batch_size
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = global_batch_size // world_size
        self.loop = loop
        self.tokens_per_step = global_batch_size * self.seq_len
        self.steps_per_epoch = max(0, (self.shards.n_tokens - 1) // self.tokens_per_step)
        if self.steps_per_epoch == 0:
            raise ShardError(path, f"holds {self.shards.n_tokens} tokens, fewer than one global batch "
                                   f"({self.tokens_per_step} + 1)")
        self.token_offset = 0
        self.epoch = 0

    # ---- position ----
    @property
    def tokens_consumed(self) -> int:
        """Tokens stepped over since the start of epoch 0 (what a trainer logs as tokens seen)."""
        return self.epoch * self.steps_per_epoch * self.tokens_per_step + self.token_offset

    def seek(self, token_offset: int, epoch: int = 0) -> None:
        """Continue from a global token offset (e.g. step * tokens_per_step) of the given epoch."""
        if not 0 <= token_offset < self.shards.n_tokens:
            raise ValueError(f"token offset {token_offset} is outside the stream of {self.shards.n_tokens} tokens")
        self.token_offset, self.epoch = int(token_offset), int(epoch)

    def seek_step(self, step: int) -> None:
        """Position at global step `step` (counted from the start of this shard set)."""
        epoch, within = divmod(step, self.steps_per_epoch) if self.loop else (0, step)
        self.seek(within * self.tokens_per_step, epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"schema": CURSOR_SCHEMA, "shard_set": self.manifest.set_digest, "token_offset": self.token_offset,
                "epoch": self.epoch, "seq_len": self.seq_len, "global_batch_size": self.global_batch_size,
                "tokens_consumed": self.tokens_consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("schema") != CURSOR_SCHEMA:
            raise ValueError(f"cursor schema is {state.get('schema')!r}, expected {CURSOR_SCHEMA!r}")
        if state["shard_set"] != self.manifest.set_digest:
            raise ShardError(self.shards.directory, "the cursor belongs to a different shard set "
                             f"({state['shard_set'][:12]}…, this one is {self.manifest.set_digest[:12]}…)")
        if state["seq_len"] != self.seq_len:
            raise ValueError(f"the cursor was taken with seq_len {state['seq_len']}, this reader uses {self.seq_len}")
        self.seek(int(state["token_offset"]), int(state["epoch"]))

    # ---- iteration ----
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        return self.next_batch()

    def next_batch(self) -> dict[str, np.ndarray]:
        """This rank's share of the next global batch; advances the global cursor by one step."""
        if self.token_offset + self.tokens_per_step + 1 > self.shards.n_tokens:
            if not self.loop:
                raise StopIteration
            self.token_offset, self.epoch = 0, self.epoch + 1
        first = self.token_offset + self.rank * self.local_batch_size * self.seq_len
        starts = [first + j * self.seq_len for j in range(self.local_batch_size)]
        batch = _window_batch(self.shards, starts, self.seq_len, self.manifest.eos_id)
        self.token_offset += self.tokens_per_step
        return batch


class EvalReader:
    """A fixed held-out set, read once per iteration, identically every time.

    Windows advance by `seq_len` from the start of the stream until every token after the first
    has been a target exactly once; the last window is padded (loss_mask False). Window w goes to
    rank w % world_size, and every rank yields the same number of batches (padded with fully
    masked windows), so data-parallel evaluation never hangs on an uneven split. Sum the loss over
    `loss_mask` across ranks for the exact mean.
    """

    def __init__(self, path: str | os.PathLike, *, batch_size: int, seq_len: int | None = None, rank: int = 0,
                 world_size: int = 1, tokenizer: Any = None, verify_hashes: bool = False,
                 max_windows: int | None = None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.shards = ShardSet.open(path, tokenizer=tokenizer, verify_hashes=verify_hashes)
        self.manifest = self.shards.manifest
        self.seq_len = int(seq_len or self.manifest.seq_len)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size
        n_windows = -(-(self.shards.n_tokens - 1) // self.seq_len) if self.shards.n_tokens > 1 else 0
        self.n_windows = min(n_windows, max_windows) if max_windows is not None else n_windows
        per_rank = -(-self.n_windows // world_size)
        self.n_batches = -(-per_rank // batch_size)
        self.n_target_tokens = min(self.shards.n_tokens - 1, self.n_windows * self.seq_len)

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        mine = list(range(self.rank, self.n_windows, self.world_size))
        for b in range(self.n_batches):
            windows = mine[b * self.batch_size:(b + 1) * self.batch_size]
            starts = [w * self.seq_len for w in windows]
            batch = _window_batch(self.shards, starts, self.seq_len, self.manifest.eos_id)
            pad = self.batch_size - len(windows)
            if pad:
                batch = {k: np.concatenate([v, np.full((pad, self.seq_len), _pad_value(k, self.manifest.eos_id),
                                                       dtype=v.dtype)]) for k, v in batch.items()}
            yield batch


def _pad_value(key: str, pad_id: int) -> Any:
    return {"loss_mask": False, "position_ids": 0, "doc_ids": -1}.get(key, pad_id)
