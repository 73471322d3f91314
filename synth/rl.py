"""RL prompt selection and curriculum (Llama-Nemotron §6.1-6.2; Nemotron 3 §3) as pure functions.

- Difficulty by pass rate: k samples per prompt from a policy/estimator endpoint, verified;
  pass_rate = correct / k. Prompts at or above `max_pass_rate` (0.75 by default, LN-Super's
  filter: with k=8, 6/8 and above go) are dropped; optionally those never solved
  (`drop_never_solved`, Nemotron 3's "remove prompts the SFT model consistently answers" is the
  other end) or below `min_pass_rate`.
- Curriculum order: easy to hard (non-increasing pass rate; Nemotron 3 §3), or LN §6.2's
  progressive batches: batch i draws from a Gaussian over pass-rate values centred at mu_i,
  which moves from easy to hard; counts are allocated by the target and availability, capacity
  left over is filled from the values with the largest remaining pools, and samples are shuffled
  inside each batch; the full batches are then emitted easiest first (`easiest_first`), so the
  schedule is monotone on any pool. sigma and the mu schedule are not given by the paper: sigma=0.15 and a mu
  that follows the unplaced pool (`curriculum_mu`) are our defaults; a linear schedule between
  given end points is available.
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from purokit.hashing import stable_id

LOGPROB_MODES_AFTER_TRANSFORMS = {"processed_logprobs", "processed_logits"}


def pass_rate(verdicts: Sequence[bool]) -> float:
    if not verdicts:
        raise ValueError("pass rate of zero samples is undefined")
    return sum(bool(v) for v in verdicts) / len(verdicts)


def difficulty_filter(rate: float, max_pass_rate: float = 0.75, min_pass_rate: float | None = None,
                      drop_never_solved: bool = False) -> str | None:
    """None when the prompt is kept, else the reason it is dropped."""
    if rate >= max_pass_rate:
        return f"too easy: pass rate {rate:.3f} >= {max_pass_rate}"
    if drop_never_solved and rate == 0.0:
        return "never solved: pass rate 0"
    if min_pass_rate is not None and rate < min_pass_rate:
        return f"too hard: pass rate {rate:.3f} < {min_pass_rate}"
    return None


def order_easy_to_hard(items: Sequence[tuple[str, float]], seed: int = 0) -> list[str]:
    """Ids by non-increasing pass rate; ties in a seeded, reproducible order."""
    return [i for i, _ in sorted(items, key=lambda x: (-x[1], stable_id(seed, x[0])))]


def curriculum_mu(pools: dict[float, list[str]], size: int, b: int, n_batches: int,
                  mu_start: float | None = None, mu_end: float | None = None) -> float:
    """Centre of batch b's target. With mu_start/mu_end: linear between them over the batches.
    By default it follows the pool: the mean pass rate of the `size` easiest prompts still
    unplaced (the batch a plain easy-to-hard sort would make next). A fixed linear schedule over
    a pool whose values are not uniform leaves easy prompts unplaced until the last batches."""
    if mu_start is not None or mu_end is not None:
        vals = [v for v in pools if pools[v]]
        a = max(vals) if mu_start is None else mu_start
        z = min(vals) if mu_end is None else mu_end
        return a + (z - a) * (b / (n_batches - 1) if n_batches > 1 else 0.0)
    taken, acc = 0, 0.0
    for v in sorted(pools, reverse=True):
        k = min(len(pools[v]), size - taken)
        acc += k * v
        taken += k
        if taken >= size:
            break
    return acc / max(1, taken)


def gaussian_curriculum_batches(items: Sequence[tuple[str, float]], batch_size: int, sigma: float = 0.15,
                                mu_start: float | None = None, mu_end: float | None = None,
                                seed: int = 0) -> list[list[str]]:
    """LN §6.2 progressive-difficulty batches. Every batch but possibly the last has exactly
    `batch_size` ids, no id repeats, and the output is a pure function of the inputs and seed."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    if sigma <= 0:
        raise ValueError("sigma must be > 0")
    rng = random.Random(seed)
    pools: dict[float, list[str]] = {}
    for i, p in sorted(items, key=lambda x: (x[1], x[0])):
        pools.setdefault(round(p, 9), []).append(i)
    for v in sorted(pools):
        rng.shuffle(pools[v])
    values = sorted(pools)
    if not values:
        return []
    n_total = sum(len(v) for v in pools.values())
    n_batches = math.ceil(n_total / batch_size)
    batches: list[list[str]] = []
    for b in range(n_batches):
        remaining = sum(len(pools[v]) for v in values)
        size = min(batch_size, remaining)
        mu = curriculum_mu(pools, size, b, n_batches, mu_start, mu_end)
        avail = [v for v in values if pools[v]]
        weights = {v: math.exp(-((v - mu) ** 2) / (2 * sigma ** 2)) for v in avail}
        total_w = sum(weights.values()) or 1.0
        target = {v: size * w / total_w for v, w in weights.items()}
        # integer counts by largest remainder, then capped by what each value has left
        want = {v: int(math.floor(t)) for v, t in target.items()}
        short = size - sum(want.values())
        for v in sorted(avail, key=lambda v: (-(target[v] - want[v]), v))[:short]:
            want[v] += 1
        alloc = {v: min(len(pools[v]), want[v]) for v in avail}
        # capacity left: the values with the largest remaining pools (LN §6.2 fill rule)
        while sum(alloc.values()) < size:
            v = max(avail, key=lambda v: (len(pools[v]) - alloc[v], -v))
            if len(pools[v]) - alloc[v] <= 0:
                break
            alloc[v] += 1
        batch: list[str] = []
        for v in values:
            k = alloc.get(v, 0)
            batch += pools[v][:k]
            del pools[v][:k]
        rng.shuffle(batch)
        batches.append(batch)
    return easiest_first(batches, {i: round(p, 9) for i, p in items})


def easiest_first(batches: list[list[str]], rate: dict[str, float]) -> list[list[str]]:
    """The full batches in non-increasing order of mean pass rate (stable), the short last one
    last. On a skewed pool the Gaussian target runs out near mu and the fill rule takes prompts
    from the largest pools, so batch means built in schedule order are not monotone (Spearman
    -0.27 with 60% of prompts at 5/8); emitting the same batches easiest first makes the schedule
    monotone easy -> hard, which is LN §6.2's intent, and leaves every batch's composition as drawn."""
    full = batches if not batches or len(batches[-1]) == len(batches[0]) else batches[:-1]
    rest = batches[len(full):]
    order = sorted(range(len(full)), key=lambda b: (-sum(rate[i] for i in full[b]) / len(full[b]), b))
    return [full[b] for b in order] + rest


def rollout_fields(result: Any, teacher: dict[str, Any], params: dict[str, Any], seed: int | None,
                   max_context: int | None = None, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `rollout` of a record from a ChatResult: token ids only as the engine returned them
    (never re-tokenized), logprobs with their provenance, truncation (Ring-linear §4.4).
    `served` is what the endpoint reported about itself (`synth.backends.endpoint_info`: engine,
    engine_version, precision, logprobs_mode); what it did not report is the teacher config's,
    marked `declared`."""
    served = served or {}
    teacher = dict(teacher, **{k: served[k] for k in ("engine", "precision", "logprobs_mode") if served.get(k)})
    mode = teacher.get("logprobs_mode", "raw_logprobs")
    ids = result.token_ids
    lps = result.logprobs
    if ids is not None and lps is not None and len(ids) != len(lps):
        lps = None          # misaligned: keep the ids, refuse to pretend the logprobs line up
    return {
        "prompt_token_ids": result.prompt_token_ids,
        "completion_token_ids": ids,
        "rollout_logprobs": lps,
        "logprobs_mode": mode,
        "logprobs_after_sampling_transforms": mode in LOGPROB_MODES_AFTER_TRANSFORMS,
        "engine": teacher.get("engine", "unknown"),
        "precision": teacher.get("precision", "unknown"),
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "top_k": params.get("top_k"),
        "seed": seed,
        "policy": teacher.get("model", ""),
        "finish_reason": result.finish_reason,
        "truncated": result.finish_reason == "length",
        "max_context": max_context,
        "token_ids_source": "engine" if ids is not None else "none",
        **{f"{k}_source": "endpoint" if served.get(k) else "declared" for k in ("engine", "precision", "logprobs_mode")},
        "engine_version": served.get("engine_version"),
    }
