"""Token accounting: steps, buckets and the phase transition in numbers (Puro §3.6, §3.6.2, §2.1).

A test oracle (no product code calls it): pure arithmetic that checks the curriculum math against
the paper; `puro_production()` reproduces the paper's figures (seed-puro.md §4 and behaviours 2, 13, 14).
"""

from __future__ import annotations

from dataclasses import dataclass


def tokens_per_step(seq_len: int, global_batch_size: int) -> int:
    """Tokens one optimizer step consumes: 4,096 x 1,536 = 6,291,456 in production (Puro §2.1)."""
    return int(seq_len) * int(global_batch_size)


def steps_for_tokens(n_tokens: float, seq_len: int, global_batch_size: int) -> float:
    return float(n_tokens) / tokens_per_step(seq_len, global_batch_size)


def token_offset_of_step(step: int, seq_len: int, global_batch_size: int) -> int:
    """Where a sequential reader resumes at global step `step` (Puro behaviour 15)."""
    return int(step) * tokens_per_step(seq_len, global_batch_size)


def bucket_tokens(pool_tokens: float, bucket_count: int) -> float:
    """Tokens per curriculum bucket: 938.06B / 376 = 2.4948B (Puro §3.4)."""
    return float(pool_tokens) / int(bucket_count)


def transition_side_tokens(transition_tokens: float) -> float:
    """Each side of a linear transition contributes half of it: 43.9B -> 21.95B (Puro §3.6.2)."""
    return float(transition_tokens) / 2.0


def phase2_stage_tokens(pool_tokens: float, transition_tokens: float) -> float:
    """Phase-2 stage = the whole phase-2 pool + the replay half of the transition (938.1 + 21.9 = 960.0B)."""
    return float(pool_tokens) + transition_side_tokens(transition_tokens)


def buckets_in_transition(transition_tokens: float, pool_tokens: float, bucket_count: int) -> float:
    """How many curriculum buckets the transition's phase-2 half reaches into (21.9 / 2.495 = 8.8)."""
    return transition_side_tokens(transition_tokens) / bucket_tokens(pool_tokens, bucket_count)


@dataclass(frozen=True)
class TwoPhasePlan:
    seq_len: int
    global_batch_size: int
    phase1_tokens: float
    phase2_pool_tokens: float
    transition_tokens: float
    bucket_count: int

    @property
    def tokens_per_step(self) -> int:
        return tokens_per_step(self.seq_len, self.global_batch_size)

    @property
    def phase1_steps(self) -> float:
        return self.phase1_tokens / self.tokens_per_step

    @property
    def phase2_stage_tokens(self) -> float:
        return phase2_stage_tokens(self.phase2_pool_tokens, self.transition_tokens)

    @property
    def phase2_steps(self) -> float:
        return self.phase2_stage_tokens / self.tokens_per_step

    @property
    def total_tokens(self) -> float:
        return self.phase1_tokens + self.phase2_stage_tokens

    @property
    def total_steps(self) -> float:
        return self.total_tokens / self.tokens_per_step

    @property
    def bucket_tokens(self) -> float:
        return bucket_tokens(self.phase2_pool_tokens, self.bucket_count)

    @property
    def transition_side_tokens(self) -> float:
        return transition_side_tokens(self.transition_tokens)

    @property
    def transition_steps(self) -> float:
        return self.transition_tokens / self.tokens_per_step

    def phase2_step_of(self, global_step: int) -> float:
        """Global steps continue counting from Phase 1 (one counter)."""
        return global_step - self.phase1_steps


def puro_production() -> TwoPhasePlan:
    """The Puro-2B run: 4,096 x 1,536 per step, 438.84B phase 1, a 938.06B phase-2 pool in 376
    buckets, a 43.9B-token transition."""
    return TwoPhasePlan(seq_len=4096, global_batch_size=1536, phase1_tokens=438.84e9,
                        phase2_pool_tokens=938.06e9, transition_tokens=43.9e9, bucket_count=376)
