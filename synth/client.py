"""OpenAI chat-completions client for teacher fleets: several endpoints per model, load spreading,
a bounded readiness probe, adaptive per-endpoint concurrency (AIMD on 429, a latency gradient on
slowness), retries with backoff and jitter, and a circuit breaker that stops with a clear error
instead of stalling.

Works against anything that speaks `/v1/chat/completions`: `vllm serve`, SGLang, llama.cpp's
server, hosted providers. HTTP is aiohttp (a standard client; at 256 concurrent requests it keeps
~25x the request rate of httpx, which matters when the teacher is a large fleet).

Why each mechanism exists (anchors.md §2.3, users' complaints about the anchors):
- readiness probe: NeMo-Skills "server not ready after 300 s" races -> `wait_ready(timeout_s)`
  polls `/v1/models` until the model is listed, and fails with the last error when time is up.
- AIMD: Data Designer halves concurrency on 429 (as here) but has no breaker, so sustained 429s
  stall for minutes and return 0 records -> `CircuitBreaker` trips after N consecutive failures,
  and when every endpoint is open `CircuitOpenError` names each endpoint and its last error.
- latency gradient: a teacher that is slow but never throttles (vLLM on a loaded CPU) got the
  full concurrency, every answer then took longer than `timeout_s` and nothing completed ->
  `LatencyGradient` lowers the limit when latency per token rises, and an answer that took most
  of `timeout_s` (or a timeout) halves it, so answers keep arriving before the timeout.

The pure pieces (`AdaptiveLimit`, `CircuitBreaker`, `backoff_delay_s`, `parse_chat_response`,
`request_body`) carry the logic and are unit-tested; `ChatClient` is the thin async shell.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from pydantic import Field

from purokit.config import StrictModel
from purokit.log import get_logger
from purokit.records import json_mapping
from synth.toolcalls import ToolCallShapeError, normalize_tool_calls

log = get_logger("synth.client")

# ---------------------------------------------------------------------------------------------
# Requests and results
# ---------------------------------------------------------------------------------------------

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "min_p")


@dataclass
class ChatRequest:
    """One chat completion. `params` holds sampling parameters (temperature, top_p, max_tokens, ...);
    `seed` is per request so that n samples of one prompt are n distinct, reproducible requests."""

    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: dict[str, Any] | None = None      # constrained output where the server supports it
    return_token_ids: bool = False                 # vLLM: sampled token ids (RL rollouts)
    tools: list[dict[str, Any]] | None = None      # OpenAI tools: [{"type": "function", "function": {...}}]
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | {"type": "function", ...}
    tag: str = ""                                  # caller's label, not sent

    def cache_payload(self, model: str) -> dict[str, Any]:
        """Everything that determines the answer (and nothing else: not the endpoint URL). The
        tool fields enter the key only when set, so caches of requests without tools stay valid."""
        payload = {"model": model, "messages": self.messages, "params": self.params, "seed": self.seed,
                   "logprobs": self.logprobs, "top_logprobs": self.top_logprobs,
                   "json_schema": self.json_schema, "return_token_ids": self.return_token_ids}
        if self.tools is not None:
            payload["tools"] = self.tools
        if self.tool_choice is not None:
            payload["tool_choice"] = self.tool_choice
        return payload


@dataclass
class ChatResult:
    content: str
    finish_reason: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens: list[str] | None = None                # sampled token strings (with logprobs)
    logprobs: list[float] | None = None            # per sampled token, as the engine reports them
    token_ids: list[int] | None = None             # sampled token ids, exactly as the engine sampled
    prompt_token_ids: list[int] | None = None
    model: str = ""
    endpoint: str = ""
    latency_s: float = 0.0
    attempts: int = 1
    cached: bool = False
    # OpenAI tool calls of the answer ({"id", "type": "function", "function": {"name", "arguments":
    # JSON text}}); finish_reason is then "tool_calls" (or "stop" for a named tool_choice, as vLLM does)
    tool_calls: list[dict[str, Any]] | None = None
    # the thinking a reasoning parser split off (vLLM/SGLang `--reasoning-parser`: `reasoning_content`,
    # newer vLLM and OpenRouter: `reasoning`; DeepSeek's API: `reasoning_content`) and which field held it
    reasoning: str | None = None
    reasoning_field: str | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("content", "finish_reason", "prompt_tokens", "completion_tokens",
                                              "tokens", "logprobs", "token_ids", "prompt_token_ids", "model",
                                              "endpoint", "tool_calls", "reasoning", "reasoning_field")}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ChatResult":
        return cls(**{k: d.get(k) for k in ("content", "finish_reason", "tokens", "logprobs", "token_ids",
                                             "prompt_token_ids", "tool_calls", "reasoning", "reasoning_field")},
                   prompt_tokens=d.get("prompt_tokens") or 0, completion_tokens=d.get("completion_tokens") or 0,
                   model=d.get("model") or "", endpoint=d.get("endpoint") or "")


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

class EndpointError(RuntimeError):
    """Base of every client error; `retryable` says whether another attempt can help."""
    retryable = True

    def __init__(self, endpoint: str, message: str, status: int | None = None, retry_after_s: float | None = None):
        self.endpoint = endpoint
        self.status = status
        self.retry_after_s = retry_after_s
        super().__init__(f"{endpoint}: {message}")


class ThrottledError(EndpointError):
    """HTTP 429: the endpoint asks us to slow down (AIMD halves its concurrency)."""


class ServerError(EndpointError):
    """HTTP 5xx."""


class TransportError(EndpointError):
    """Timeout, refused or dropped connection, truncated body or stream."""
    timed_out = False               # no answer within timeout_s: a congestion signal, like a 429


class MalformedResponse(EndpointError):
    """A 200 whose body is not a chat completion (bad JSON, missing fields)."""


class RequestRejected(EndpointError):
    """HTTP 4xx other than 429: the request itself is wrong (model name, parameters). Not retried."""
    retryable = False


class CircuitOpenError(RuntimeError):
    """Every endpoint of a teacher keeps failing: stop with the evidence instead of stalling."""


class EndpointNotReady(RuntimeError):
    """The readiness probe ran out of time."""


class RetriesExhausted(RuntimeError):
    def __init__(self, last: EndpointError, attempts: int):
        self.last = last
        self.attempts = attempts
        super().__init__(f"gave up after {attempts} attempts; last error: {last}")


# ---------------------------------------------------------------------------------------------
# Pure control logic
# ---------------------------------------------------------------------------------------------

class LatencyGradient:
    """The latency half of the limit: Netflix concurrency-limits' Gradient2 rule on latency per
    completion token (so long and short answers are comparable).

    `long_s` is the latency the endpoint shows when it is not queueing: the mean of the first
    `warmup` answers, then an exponential average over `long_window` answers (a window so long
    that a queue building up within it shows as a rise). Each answer gives
        gradient = clamp(tolerance * long_s / latency, 0.5, 1.0)
    1.0 while answers are at most `tolerance` times the baseline; below it in proportion to how
    much slower they got, never under a half (an outlier must not collapse the limit). When
    answers are more than twice as fast as the baseline, the queue that inflated it has drained:
    the baseline decays toward them at once instead of waiting out the window."""

    def __init__(self, tolerance: float = 1.5, long_window: int = 600, warmup: int = 10):
        if tolerance < 1.0:
            raise ValueError(f"latency tolerance must be >= 1 (got {tolerance})")
        self.tolerance = tolerance
        self.long_window = long_window
        self.warmup = warmup
        self.long_s = 0.0
        self.n = 0

    def observe(self, per_token_s: float) -> float:
        """Take one answer's latency per token; return the gradient in [0.5, 1]."""
        self.n += 1
        if self.n <= self.warmup:
            self.long_s += (per_token_s - self.long_s) / self.n
        else:
            self.long_s += (per_token_s - self.long_s) * 2.0 / (self.long_window + 1)
        if per_token_s <= 0.0:
            return 1.0
        if self.long_s / per_token_s > 2.0:
            self.long_s *= 0.95
        return max(0.5, min(1.0, self.tolerance * self.long_s / per_token_s))


class AdaptiveLimit:
    """The concurrency limit of one endpoint: AIMD on throttling, a latency gradient on slowness.

    On a 429 (or a timeout, or an answer that took most of `timeout_s`) the limit halves, but at
    most once per round trip: signals for requests issued before the last decrease are echoes of
    the same congestion event (TCP's rule). Each success adds 1/limit, so the limit grows by about
    one per window of `limit` successes ("grow slowly") — unless the success was slow: with a
    `LatencyGradient`, an answer whose latency per token rose above the tolerance lowers the limit
    smoothly instead, `value *= 1 - smoothing * (1 - gradient)`, so a teacher that never throttles
    but gets slower under load (vLLM on a busy CPU) is held near the concurrency where it still
    answers at full speed. A success at an inflight below half the limit does not grow it: the
    limit was not what held throughput back (Gradient2's app-limited rule).
    """

    def __init__(self, initial: int = 8, minimum: int = 1, maximum: int = 256,
                 gradient: LatencyGradient | None = None, smoothing: float = 0.2):
        if not (1 <= minimum <= initial <= maximum):
            raise ValueError(f"need 1 <= min ({minimum}) <= initial ({initial}) <= max ({maximum})")
        self.value = float(initial)
        self.minimum = minimum
        self.maximum = maximum
        self.gradient = gradient
        self.smoothing = smoothing
        self.epoch = 0                      # incremented on every decrease
        self.n_decreases = 0
        self.n_latency_cuts = 0             # successes whose latency lowered the limit

    @property
    def limit(self) -> int:
        return max(self.minimum, int(self.value))

    def on_success(self, latency_s: float | None = None, n_tokens: int = 1, inflight: int | None = None) -> None:
        """One answer came back, `latency_s` after it was sent with `inflight` requests out."""
        if self.gradient is not None and latency_s is not None:
            g = self.gradient.observe(latency_s / max(1, n_tokens))
            if g < 1.0:
                self.value = max(float(self.minimum), self.value * (1.0 - self.smoothing * (1.0 - g)))
                self.n_latency_cuts += 1
                return
        if inflight is not None and inflight < self.value / 2:
            return
        self.value = min(float(self.maximum), self.value + 1.0 / max(self.value, 1.0))

    def on_throttle(self, issued_epoch: int) -> bool:
        """Halve if the congested request was issued in the current epoch; True if it decreased."""
        if issued_epoch != self.epoch:
            return False
        self.value = max(float(self.minimum), self.value / 2.0)
        self.epoch += 1
        self.n_decreases += 1
        return True


class CircuitBreaker:
    """closed -> (N consecutive failures) -> open for `cooldown_s` -> half-open (one probe request)
    -> closed on success, open again on failure. `n_trips` counts consecutive trips without a
    success in between; the pool gives up when every endpoint has tripped `max_trips` times."""

    def __init__(self, failures_to_trip: int = 20, cooldown_s: float = 10.0, max_trips: int = 3):
        self.failures_to_trip = failures_to_trip
        self.cooldown_s = cooldown_s
        self.max_trips = max_trips
        self.consecutive_failures = 0
        self.n_trips = 0
        self.open_until = 0.0
        self.probe_in_flight = False
        self.last_error: str = ""

    def state(self, now: float) -> str:
        if not self.open_until:
            return "closed"
        if now < self.open_until:
            return "open"
        return "half-open"

    @property
    def exhausted(self) -> bool:
        return self.n_trips >= self.max_trips

    def allow(self, now: float) -> bool:
        st = self.state(now)
        if st == "closed":
            return True
        if st == "half-open" and not self.probe_in_flight and not self.exhausted:
            return True
        return False

    def on_success(self) -> None:
        self.consecutive_failures = 0
        self.n_trips = 0
        self.open_until = 0.0
        self.probe_in_flight = False

    def on_failure(self, now: float, error: str) -> bool:
        """Record a failed attempt; True if this failure tripped (or re-tripped) the breaker."""
        self.last_error = error
        self.probe_in_flight = False
        self.consecutive_failures += 1
        if self.open_until and now >= self.open_until:
            # the half-open probe failed
            self.n_trips += 1
            self.open_until = now + self.cooldown_s
            return True
        if not self.open_until and self.consecutive_failures >= self.failures_to_trip:
            self.n_trips += 1
            self.open_until = now + self.cooldown_s
            return True
        return False


def backoff_delay_s(attempt: int, base_s: float, cap_s: float, rng: random.Random,
                    retry_after_s: float | None = None) -> float:
    """Exponential backoff with full jitter (uniform in [0, min(cap, base*2^attempt)]), never
    shorter than the server's Retry-After."""
    delay = rng.uniform(0.0, min(cap_s, base_s * (2 ** attempt)))
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, cap_s))
    return delay


def request_body(model: str, req: ChatRequest, stream: bool = False,
                 constrained_output: str = "json_schema") -> dict[str, Any]:
    """The JSON body for `/v1/chat/completions`.

    Non-OpenAI sampling keys (top_k, repetition_penalty, min_p) are accepted by vLLM and SGLang
    at the top level; hosted providers ignore or reject them, so configure them only where served.
    """
    body: dict[str, Any] = {"model": model, "messages": req.messages}
    for k, v in req.params.items():
        if v is not None:
            body[k] = v
    if req.seed is not None:
        body["seed"] = req.seed
    if req.logprobs:
        body["logprobs"] = True
        if req.top_logprobs:
            body["top_logprobs"] = req.top_logprobs
    if req.return_token_ids:
        body["return_token_ids"] = True                 # vLLM >= 0.10.2: choices[].token_ids
        if req.logprobs:
            body["return_tokens_as_token_ids"] = True   # older vLLM: "token_id:N" logprob tokens
    if req.tools is not None:
        body["tools"] = req.tools
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    if req.json_schema is not None:
        if constrained_output == "json_schema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": req.json_schema}}
        elif constrained_output == "json_object":       # llama.cpp's server
            body["response_format"] = {"type": "json_object", "schema": req.json_schema}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _token_id_of(tok: str) -> int | None:
    if tok.startswith("token_id:"):
        try:
            return int(tok[len("token_id:"):])
        except ValueError:
            return None
    return None


def parse_logprobs(lp: Any) -> tuple[list[str] | None, list[float] | None, list[int] | None]:
    """(tokens, logprobs, token ids) from an OpenAI `logprobs` object; ids only when every token
    is vLLM's `token_id:N` form (return_tokens_as_token_ids), never by re-tokenizing text."""
    if not lp or not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None, None, None
    tokens, values = [], []
    for item in lp["content"]:
        tokens.append(str(item.get("token", "")))
        v = item.get("logprob")
        values.append(float(v) if v is not None else float("nan"))
    ids = [_token_id_of(t) for t in tokens]
    return tokens, values, (ids if ids and all(i is not None for i in ids) else None)  # type: ignore[return-value]


def parse_chat_response(endpoint: str, data: Any) -> ChatResult:
    """Validate a chat-completion body and pull out what the engine keeps."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise MalformedResponse(endpoint, f"not a chat completion (no choices): {str(data)[:200]}")
    choice = data["choices"][0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise MalformedResponse(endpoint, f"choice has no message: {str(choice)[:200]}")
    content = msg.get("content")
    if content is None:
        # a reply cut off while thinking has null content (the thinking is in `reasoning_content`);
        # an answer that only calls tools has null content too
        content = ""
    reasoning, reasoning_field = reasoning_of(msg)
    try:
        tool_calls = normalize_tool_calls(msg.get("tool_calls"))
    except ToolCallShapeError as e:
        raise MalformedResponse(endpoint, f"message.{e}") from None
    tokens, lps, ids = parse_logprobs(choice.get("logprobs"))
    if isinstance(choice.get("token_ids"), list):
        ids = [int(t) for t in choice["token_ids"]]
    usage = data.get("usage") or {}
    return ChatResult(
        content=str(content), finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        tokens=tokens, logprobs=lps, token_ids=ids,
        prompt_token_ids=data.get("prompt_token_ids") if isinstance(data.get("prompt_token_ids"), list) else None,
        model=str(data.get("model") or ""), endpoint=endpoint, tool_calls=tool_calls,
        reasoning=reasoning, reasoning_field=reasoning_field)


REASONING_FIELDS = ("reasoning_content", "reasoning")


def reasoning_of(msg: dict[str, Any]) -> tuple[str | None, str | None]:
    """(thinking text, the field it came in) of a message or stream delta; (None, None) without."""
    for f in REASONING_FIELDS:
        v = msg.get(f)
        if isinstance(v, str) and v:
            return v, f
    return None, None


def served_info_from(model: str, models: Any, version: Any, server_info: Any) -> dict[str, Any]:
    """Engine, version, precision and logprobs mode as the server reports them: vLLM lists
    `owned_by: vllm` in /v1/models, its version at /version, and (dev mode,
    `VLLM_SERVER_DEV_MODE=1`) its whole config at /server_info (model_config.dtype,
    model_config.logprobs_mode). Keys the server did not report are absent."""
    out: dict[str, Any] = {}
    entries = models.get("data") if isinstance(models, dict) else None
    entry = next((m for m in entries or [] if isinstance(m, dict) and m.get("id") == model), None)
    if entry and isinstance(entry.get("owned_by"), str) and entry["owned_by"].lower() in ("vllm", "sglang"):
        out["engine"] = entry["owned_by"].lower()
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        out["engine_version"] = version["version"]
    cfg = json_mapping(server_info.get("vllm_config")) if isinstance(server_info, dict) else None
    mc = cfg.get("model_config") if cfg is not None else None
    if isinstance(mc, dict):
        out["engine"] = out.get("engine") or "vllm"
        if mc.get("dtype"):
            out["precision"] = str(mc["dtype"]).removeprefix("torch.")
        if mc.get("logprobs_mode"):
            out["logprobs_mode"] = str(mc["logprobs_mode"]).rsplit(".", 1)[-1].lower()
    return out


def _retry_after(headers: Any) -> float | None:
    v = headers.get("retry-after") if headers is not None else None
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def classify_status(endpoint: str, status: int, text: str, headers: Any = None) -> EndpointError:
    snippet = text[:300].replace("\n", " ")
    if status == 429:
        return ThrottledError(endpoint, f"HTTP 429 (throttled): {snippet}", status, _retry_after(headers))
    if status >= 500:
        return ServerError(endpoint, f"HTTP {status}: {snippet}", status, _retry_after(headers))
    if status in (408, 409):
        return TransportError(endpoint, f"HTTP {status}: {snippet}", status)
    return RequestRejected(endpoint, f"HTTP {status}, the request was rejected: {snippet}", status)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------

class TeacherConfig(StrictModel):
    """One model behind one or more OpenAI-compatible endpoints (the unit a step asks for)."""
    model: str
    endpoints: list[str] = Field(default_factory=list, description="base URLs ending in /v1")
    backend: str = "openai"                 # "openai" (HTTP), "batch" (OpenAI Batch API) or "vllm" (in-process, GPU hosts)
    api_key_env: str | None = None          # name of the env var holding the key (never the key)
    engine: str = "unknown"                 # what serves it (vllm, sglang, llama.cpp, provider): recorded
    logprobs_mode: str = "raw_logprobs"     # vLLM V1 default: before temperature/top-p (Ring-linear §4.4)
    precision: str = "unknown"              # bf16 / fp8 ...: recorded with RL rollouts
    initial_concurrency: int = 8
    min_concurrency: int = 1
    max_concurrency: int = 64
    # the limit also falls when latency per token rises above latency_tolerance x its baseline
    # (AdaptiveLimit, LatencyGradient); false: AIMD on 429 only
    latency_aware: bool = True
    latency_tolerance: float = 1.5
    # an answer that took more than this share of timeout_s halves the limit, as a timeout does:
    # the next answers then come back well before the timeout
    slow_answer_fraction: float = 0.5
    timeout_s: float = 600.0
    max_retries: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    breaker_failures: int = 20
    breaker_cooldown_s: float = 10.0
    breaker_max_trips: int = 6           # ~1 min of total outage (6 cooldowns) before giving up
    retry_after_max_s: float = 300.0     # Retry-After windows waited out per request (longer: a failure)
    ready_timeout_s: float = 120.0
    stream: bool = False
    constrained_output: str = "json_schema"  # json_schema | json_object | none
    vllm_engine_args: dict[str, Any] = Field(default_factory=dict)   # backend: vllm
    # backend: batch (the OpenAI Batch API, synth.batch): requests collected until none arrives for
    # batch_collect_s, at most batch_max_requests per batch, polled every batch_poll_s doubling to
    # batch_poll_max_s; lines that fail or expire are sent online or fail their prompt (report)
    batch_completion_window: str = "24h"
    batch_collect_s: float = 2.0
    batch_max_requests: int = 50_000
    batch_poll_s: float = 5.0
    batch_poll_max_s: float = 300.0
    batch_failed: Literal["online", "report"] = "online"

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "endpoints": list(self.endpoints), "backend": self.backend,
                "engine": self.engine, "logprobs_mode": self.logprobs_mode, "precision": self.precision}


# ---------------------------------------------------------------------------------------------
# The async shell
# ---------------------------------------------------------------------------------------------

class Clock:
    """Time as the client sees it (monotonic seconds); `ScaledClock` lets a test wait out a
    75 s Retry-After window in under a second."""

    def now(self) -> float:
        return time.monotonic()

    def real_s(self, s: float) -> float:
        return s

    async def sleep(self, s: float) -> None:
        await asyncio.sleep(self.real_s(s))


class ScaledClock(Clock):
    """A clock running `1 / scale` times faster than the wall (scale 0.01: 75 s pass in 0.75 s)."""

    def __init__(self, scale: float):
        self.scale = scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return self._t0 + (time.monotonic() - self._t0) / self.scale

    def real_s(self, s: float) -> float:
        return s * self.scale


@dataclass
class EndpointState:
    url: str
    limit: AdaptiveLimit
    breaker: CircuitBreaker
    inflight: int = 0
    n_ok: int = 0
    n_errors: dict[str, int] = field(default_factory=dict)
    paused_until: float = 0.0              # a Retry-After window: no request goes there before it ends
    n_waits: int = 0                       # Retry-After windows waited out
    waited_s: float = 0.0
    n_timeouts: int = 0                    # attempts with no answer within timeout_s
    n_slow: int = 0                        # answers slow enough to halve the limit

    def load(self) -> float:
        return self.inflight / max(1, self.limit.limit)

    def pause(self, now: float, seconds: float) -> bool:
        """Hold requests to this endpoint for `seconds`; True when this opens a new window."""
        new = self.paused_until <= now
        self.paused_until = max(self.paused_until, now + seconds)
        if new:
            self.n_waits += 1
            self.waited_s += seconds
        return new


class EndpointPool:
    """The endpoints of a run by URL: one AIMD limit, one breaker and one Retry-After window per
    server, shared by every teacher role that sends to it (four roles on one server must not
    send four times its in-flight cap, and a server that asks to wait is waited for by all).
    The first teacher config naming a URL sets its limits."""

    def __init__(self, clock: Clock | None = None):
        self.clock = clock or Clock()
        self.states: dict[str, EndpointState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._conds: dict[frozenset[str], asyncio.Condition] = {}

    def state(self, url: str, cfg: "TeacherConfig") -> EndpointState:
        url = url.rstrip("/")
        if url not in self.states:
            gradient = LatencyGradient(cfg.latency_tolerance) if cfg.latency_aware else None
            self.states[url] = EndpointState(url, AdaptiveLimit(cfg.initial_concurrency, cfg.min_concurrency,
                                                                cfg.max_concurrency, gradient),
                                             CircuitBreaker(cfg.breaker_failures, cfg.breaker_cooldown_s,
                                                            cfg.breaker_max_trips))
        return self.states[url]

    def cond(self, urls: frozenset[str]) -> asyncio.Condition:
        """What the requests of a teacher sending to `urls` wait on. One lock guards the whole
        pool; each set of endpoints has its own condition, so a slot freed on one server wakes
        a request that can use it, not one of another teacher's queued ahead of it."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._lock, self._conds = loop, asyncio.Lock(), {}
        if urls not in self._conds:
            self._conds[urls] = asyncio.Condition(self._lock)
        return self._conds[urls]

    def wake(self, url: str, n: int | None) -> None:
        """Wake `n` waiters (None: all) of every teacher that sends to `url`; call with the lock held."""
        for urls, cond in self._conds.items():
            if url in urls:
                if n is None:
                    cond.notify_all()
                else:
                    cond.notify(n)


class ChatClient:
    """Async client for one teacher (`TeacherConfig`) over its endpoints."""

    def __init__(self, cfg: TeacherConfig, seed: int = 0, pool: EndpointPool | None = None):
        if not cfg.endpoints:
            raise ValueError(f"teacher '{cfg.model}' has no endpoints (give --endpoint URL or teachers.<name>.endpoints)")
        self.cfg = cfg
        self.pool = pool or EndpointPool()
        self.clock = self.pool.clock
        self.endpoints = [self.pool.state(u, cfg) for u in cfg.endpoints]
        self._urls = frozenset(ep.url for ep in self.endpoints)
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None
        self._rr = 0
        self.n_requests = 0
        self.n_retries = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    # ---- session -----------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        h = {"content-type": "application/json"}
        if self.cfg.api_key_env:
            key = os.environ.get(self.cfg.api_key_env)
            if not key:
                raise EndpointNotReady(f"teacher '{self.cfg.model}': environment variable {self.cfg.api_key_env} is not set")
            h["authorization"] = f"Bearer {key}"
        return h

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=conn, headers=self._headers(),
                                                  timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> "ChatClient":
        self._sess()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- readiness ---------------------------------------------------------------------------
    async def probe(self, url: str) -> str | None:
        """None when `url` lists the model, else why not."""
        try:
            async with self._sess().get(f"{url}/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
                text = await r.text()
                if r.status != 200:
                    return f"GET /models -> HTTP {r.status}: {text[:200]}"
                ids = [m.get("id") for m in json.loads(text).get("data", [])]
                if self.cfg.model not in ids:
                    return f"model '{self.cfg.model}' is not served here (served: {', '.join(map(str, ids)) or 'none'})"
                return None
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, AttributeError) as e:
            return f"{type(e).__name__}: {e}"

    async def get_json(self, url: str) -> Any:
        """GET `url` as JSON; None when the endpoint has no such route or answers otherwise."""
        try:
            async with self._sess().get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status != 200:
                    return None
                return json.loads(await r.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, UnicodeDecodeError):
            return None

    async def served_info(self) -> dict[str, Any]:
        """What the first endpoint says about how it serves the model (`served_info_from`)."""
        url = self.endpoints[0].url
        root = url[: -len("/v1")] if url.endswith("/v1") else url
        models, version, info = await asyncio.gather(self.get_json(f"{url}/models"), self.get_json(f"{root}/version"),
                                                     self.get_json(f"{root}/server_info?config_format=json"))
        return served_info_from(self.cfg.model, models, version, info)

    async def wait_ready(self, timeout_s: float | None = None, require_all: bool = False,
                         poll_s: float = 0.5) -> list[str]:
        """Poll every endpoint until it lists the model; returns the ready URLs. Raises
        `EndpointNotReady` naming each endpoint's last problem when `timeout_s` passes first."""
        timeout_s = self.cfg.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        last: dict[str, str] = {}
        while True:
            ready = []
            for ep in self.endpoints:
                why = await self.probe(ep.url)
                if why is None:
                    ready.append(ep.url)
                else:
                    last[ep.url] = why
            if ready and (not require_all or len(ready) == len(self.endpoints)):
                return ready
            if time.monotonic() >= deadline:
                detail = "; ".join(f"{u}: {w}" for u, w in last.items())
                raise EndpointNotReady(
                    f"teacher '{self.cfg.model}' not ready after {timeout_s:g} s ({detail}). "
                    "Is the server started and still loading? Raise ready_timeout_s for slow starts.")
            await asyncio.sleep(poll_s)

    # ---- endpoint choice ---------------------------------------------------------------------
    async def _acquire(self) -> EndpointState:
        self._sess()
        cond = self.pool.cond(self._urls)
        async with cond:
            while True:
                now = self.clock.now()
                free = [ep for ep in self.endpoints
                        if ep.paused_until <= now and ep.breaker.allow(now) and ep.inflight < ep.limit.limit]
                if free:
                    # least loaded first; round-robin among ties spreads a cold start evenly
                    self._rr += 1
                    best = min(free, key=lambda ep: (ep.load(), (self.endpoints.index(ep) - self._rr) % len(self.endpoints)))
                    best.inflight += 1
                    if best.breaker.state(now) == "half-open":
                        best.breaker.probe_in_flight = True
                    return best
                if all(ep.breaker.exhausted for ep in self.endpoints):
                    raise CircuitOpenError(self._breaker_report())
                waits = [ep.breaker.open_until - now for ep in self.endpoints if ep.breaker.state(now) == "open"]
                waits += [ep.paused_until - now for ep in self.endpoints if ep.paused_until > now]
                # asyncio.timeout, not wait_for: wait_for runs the wait in a second task, and a
                # cancellation that reaches both can leave the pool's lock held by a finished task
                try:
                    async with asyncio.timeout(max(0.01, self.clock.real_s(min(waits))) if waits else None):
                        await cond.wait()
                except TimeoutError:
                    pass

    def _breaker_report(self) -> str:
        parts = [f"{ep.url}: {ep.breaker.consecutive_failures} consecutive failures, "
                 f"{ep.breaker.n_trips} breaker trips, last error: {ep.breaker.last_error}" for ep in self.endpoints]
        return (f"every endpoint of teacher '{self.cfg.model}' keeps failing, stopping instead of waiting: "
                + " | ".join(parts)
                + ". Check the servers (overloaded? wrong model?), lower max_concurrency, or add endpoints.")

    async def _release(self, ep: EndpointState, woken: int | None = 1) -> None:
        """Free a slot and wake `woken` waiters: one per freed or added slot (waking every waiter
        on each release is quadratic when thousands of requests are queued), or all of them
        (`None`) when the breaker changed state, since a waiter held by a half-open probe has no
        timeout and only a wake-up tells it that the endpoint is open again, closed or given up."""
        async with self.pool.cond(self._urls):
            ep.inflight -= 1
            self.pool.wake(ep.url, woken)

    # ---- one attempt -------------------------------------------------------------------------
    async def _attempt(self, ep: EndpointState, req: ChatRequest) -> ChatResult:
        body = request_body(self.cfg.model, req, stream=self.cfg.stream,
                            constrained_output=self.cfg.constrained_output)
        data = json.dumps(body).encode()
        sess = self._sess()
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                async with sess.post(f"{ep.url}/chat/completions", data=data) as r:
                    if r.status != 200:
                        raise classify_status(ep.url, r.status, await r.text(), r.headers)
                    if self.cfg.stream:
                        return await self._read_stream(ep.url, r)
                    raw = await r.read()
        except EndpointError:
            raise
        except TimeoutError:
            e = TransportError(ep.url, f"no complete answer within timeout_s={self.cfg.timeout_s:g}")
            e.timed_out = True
            raise e from None
        except aiohttp.ClientPayloadError as e:
            raise TransportError(ep.url, f"response body cut short: {e}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionError) as e:
            raise TransportError(ep.url, f"connection failed or dropped: {type(e).__name__}: {e}") from None
        except aiohttp.ClientResponseError as e:
            raise TransportError(ep.url, f"bad HTTP response: {e}") from None
        try:
            parsed = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise MalformedResponse(ep.url, f"body is not JSON ({e}): {raw[:200]!r}") from None
        return parse_chat_response(ep.url, parsed)

    async def _read_stream(self, url: str, r: aiohttp.ClientResponse) -> ChatResult:
        parts: list[str] = []
        tokens: list[str] = []
        lps: list[float] = []
        ids: list[int] = []
        finish = None
        usage: dict[str, Any] = {}
        model = ""
        done = False
        calls: dict[int, dict[str, Any]] = {}          # tool-call deltas by index: id, name, argument pieces
        thinking: list[str] = []
        thinking_field = None
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
                break
            try:
                ev = json.loads(payload)
            except json.JSONDecodeError as e:
                raise MalformedResponse(url, f"stream event is not JSON ({e}): {payload[:200]!r}") from None
            model = ev.get("model") or model
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                delta = ch.get("delta") or {}
                if delta.get("content"):
                    parts.append(delta["content"])
                piece, where = reasoning_of(delta)
                if piece:
                    thinking.append(piece)
                    thinking_field = thinking_field or where
                for tc in delta.get("tool_calls") or []:
                    # OpenAI streams a call as its id and name first, then pieces of the arguments
                    if not isinstance(tc, dict) or not isinstance(tc.get("index"), int):
                        raise MalformedResponse(url, f"stream tool_call delta without an index: {str(tc)[:200]}")
                    slot = calls.setdefault(tc["index"], {"id": None, "type": "function", "name": "", "args": []})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    if fn.get("arguments"):
                        slot["args"].append(fn["arguments"])
                t, v, i = parse_logprobs(ch.get("logprobs"))
                if t:
                    tokens += t
                    lps += v or []
                    ids += i or []
                if isinstance(ch.get("token_ids"), list):
                    ids += [int(x) for x in ch["token_ids"]]
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        if not done:
            raise TransportError(url, f"stream ended before [DONE] after {len(parts)} chunks (truncated)")
        try:
            tool_calls = normalize_tool_calls([{"id": c["id"], "type": c["type"], "function": {
                "name": c["name"], "arguments": "".join(c["args"])}} for _, c in sorted(calls.items())])
        except ToolCallShapeError as e:
            raise MalformedResponse(url, f"streamed {e}") from None
        return ChatResult(content="".join(parts), finish_reason=finish, tool_calls=tool_calls,
                          prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or len(tokens)),
                          tokens=tokens or None, logprobs=lps or None,
                          token_ids=ids if ids and len(ids) == len(tokens or ids) else None,
                          model=model, endpoint=url, reasoning="".join(thinking) or None, reasoning_field=thinking_field)

    # ---- public ------------------------------------------------------------------------------
    async def complete(self, req: ChatRequest) -> ChatResult:
        """One chat completion with retries over the endpoints; raises `RetriesExhausted`,
        `RequestRejected` (a 4xx: fix the request) or `CircuitOpenError`."""
        last: EndpointError | None = None
        attempt = 0
        waited = 0.0
        while attempt <= self.cfg.max_retries:
            ep = await self._acquire()
            epoch, inflight = ep.limit.epoch, ep.inflight
            t0 = time.perf_counter()
            try:
                res = await self._attempt(ep, req)
            except EndpointError as e:
                # the endpoint's state is updated before the slot is freed, so that a waiter woken
                # by the release sees what this answer taught
                now = self.clock.now()
                kind = type(e).__name__
                ep.n_errors[kind] = ep.n_errors.get(kind, 0) + 1
                timed_out = getattr(e, "timed_out", False)
                ep.n_timeouts += int(timed_out)
                if isinstance(e, ThrottledError) or (timed_out and self.cfg.latency_aware):
                    ep.limit.on_throttle(epoch)
                if not e.retryable:
                    ep.breaker.probe_in_flight = False     # a rejected probe says nothing of the endpoint
                    await self._release(ep)
                    raise
                wait = e.retry_after_s
                if wait is not None and waited + wait <= self.cfg.retry_after_max_s:
                    # the server named its window: wait it out (every role on this endpoint), without
                    # counting it as a failure or an attempt, up to retry_after_max_s per request
                    waited += wait
                    ep.breaker.probe_in_flight = False
                    if ep.pause(now, wait):
                        log.warning("%s asks to wait %.0f s (Retry-After, HTTP %s): holding its requests until then "
                                    "(retry_after_max_s=%g)", ep.url, wait, e.status, self.cfg.retry_after_max_s)
                    await self._release(ep)
                    continue
                tripped = ep.breaker.on_failure(now, str(e))
                await self._release(ep, woken=None if tripped else 1)
                last = e
                self.n_retries += 1
                if attempt < self.cfg.max_retries:
                    await self.clock.sleep(backoff_delay_s(attempt, self.cfg.backoff_base_s, self.cfg.backoff_max_s,
                                                           self._rng, e.retry_after_s))
                attempt += 1
                continue
            except BaseException:
                # a cancelled or crashed probe must free the half-open slot, or every waiter waits forever
                ep.breaker.probe_in_flight = False
                await self._release(ep)
                raise
            before = ep.limit.limit
            recovered = ep.breaker.open_until != 0.0         # the half-open probe came back: all may go
            res.latency_s = time.perf_counter() - t0
            self._adapt(ep, res, epoch, inflight)
            ep.breaker.on_success()
            await self._release(ep, woken=None if recovered else 1 + max(0, ep.limit.limit - before))
            ep.n_ok += 1
            res.attempts = attempt + 1
            self.n_requests += 1
            self.prompt_tokens += res.prompt_tokens
            self.completion_tokens += res.completion_tokens
            return res
        assert last is not None
        raise RetriesExhausted(last, self.cfg.max_retries + 1)

    def _adapt(self, ep: EndpointState, res: ChatResult, epoch: int, inflight: int) -> None:
        """What an answer teaches the endpoint's limit: its latency per token, and whether it came
        so close to the timeout that the next ones, queued behind it, would not make it."""
        if self.cfg.latency_aware and res.latency_s > self.cfg.slow_answer_fraction * self.cfg.timeout_s:
            if ep.limit.on_throttle(epoch):
                ep.n_slow += 1
                log.warning("%s answered in %.1f s (> %g of timeout_s=%g): concurrency limit down to %d",
                            ep.url, res.latency_s, self.cfg.slow_answer_fraction, self.cfg.timeout_s, ep.limit.limit)
            return
        ep.limit.on_success(res.latency_s, res.completion_tokens, inflight)

    def stats(self) -> dict[str, Any]:
        return {"n_requests": self.n_requests, "n_retries": self.n_retries,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "endpoints": {ep.url: {"ok": ep.n_ok, "errors": dict(ep.n_errors), "limit": ep.limit.limit,
                                       "limit_decreases": ep.limit.n_decreases, "latency_cuts": ep.limit.n_latency_cuts,
                                       "timeouts": ep.n_timeouts, "slow_answers": ep.n_slow, "breaker_trips": ep.breaker.n_trips,
                                       "retry_after_waits": ep.n_waits, "retry_after_waited_s": round(ep.waited_s, 3)}
                              for ep in self.endpoints}}
