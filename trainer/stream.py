"""What the loop reads: this rank's training stream (synthetic, or a shard set through the mixtures reader),
the batches read ahead on a thread, the held-out micro-batches, and the check that the data lasts the run."""

from __future__ import annotations

import queue
import threading

from trainer.config import RunConfig
from trainer.data import MicroBatch, SyntheticStream, TokenStream


def open_stream(cfg: RunConfig, rank: int, world: int, cursor: dict | None, global_batch: int,
                micro_batch: int) -> TokenStream:
    """The training stream for this rank. Shard sets go through the mixtures reader."""
    d = cfg.data
    if d.train is None:
        s = d.synthetic
        nxt = int(cursor["next_sequence"]) if cursor else 0
        return SyntheticStream(s.vocab_size, s.seq_len, s.seed, global_batch, micro_batch, rank, world,
                               s.branching, s.mean_doc_tokens, nxt, with_documents=d.document_mask or d.document_positions,
                               with_positions=d.document_positions)
    from trainer.shards import ShardStream   # the adapter over mixtures.reader
    return ShardStream(d.train, global_batch=global_batch, micro_batch=micro_batch, rank=rank, world=world,
                       cursor=cursor, sft=cfg.objective == "sft", with_documents=d.document_mask or d.document_positions,
                       with_positions=d.document_positions, verify_hashes=d.verify_hashes, tokenizer=d.tokenizer,
                       seq_len=d.seq_len, loop=d.loop)


class Prefetcher:
    """Reads the next global batches on a thread while the device computes (shard reads and
    tokenization never stall a step), at most `limit` of them, one ahead. `next()` returns the
    batch and the stream's cursor after it, which is what a checkpoint taken then records."""

    def __init__(self, stream: TokenStream, limit: int, pin: bool):
        self.stream, self.pin = stream, pin
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.cursor = stream.state()
        self.thread = threading.Thread(target=self._run, args=(limit,), daemon=True, name="trainer-prefetch")
        self.thread.start()

    def _run(self, limit: int) -> None:
        for _ in range(limit):
            try:
                micro = self.stream.next_global_batch()
                if self.pin:
                    micro = [mb.pin() for mb in micro]
                self.q.put((micro, self.stream.state(), None))
            except BaseException as e:      # noqa: BLE001 - handed to the consumer, raised there
                self.q.put((None, None, e))
                return

    def next(self) -> list[MicroBatch]:
        micro, cursor, err = self.q.get()
        if err is not None:
            raise err
        self.cursor = cursor
        return micro


def eval_batches(cfg: RunConfig, rank: int, world: int, micro_batch: int):
    """This rank's micro-batches of the held-out set (the same every time), or None without one."""
    d = cfg.data
    docs = d.document_mask or d.document_positions
    if d.eval is not None:
        from trainer.shards import eval_micro_batches
        return eval_micro_batches(d.eval, micro_batch=micro_batch, rank=rank, world=world,
                                  max_windows=cfg.eval.sequences, with_documents=docs,
                                  with_positions=d.document_positions, tokenizer=d.tokenizer, seq_len=d.seq_len)
    if d.synthetic is not None and d.train is None:
        s = d.synthetic
        stream = SyntheticStream(s.vocab_size, s.seq_len, s.seed, micro_batch * world, micro_batch, rank, world,
                                 s.branching, s.mean_doc_tokens, 0, with_documents=docs,
                                 with_positions=d.document_positions, sample_seed=d.eval_synthetic_seed)
        n_rounds = -(-cfg.eval.sequences // (micro_batch * world))
        return (mb for _ in range(n_rounds) for mb in stream.next_global_batch())
    return None


def check_enough_data(cfg: RunConfig, stream: TokenStream, steps_needed: int, tokens_per_step: int) -> None:
    """Refuse a run whose stream runs out before its last step."""
    steps_left = stream.steps_left()
    if steps_left is not None and steps_left < steps_needed:
        raise ValueError(f"{cfg.data.train}: {steps_left} global batches of {tokens_per_step:,} tokens left, "
                         f"the run needs {steps_needed} (lower train.steps or set data.loop: true)")
