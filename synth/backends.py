"""Backends: one interface (`Backend.complete(ChatRequest) -> ChatResult`) over
- `HttpBackend`: OpenAI-compatible endpoints through `synth.client.ChatClient`;
- `VllmBackend`: vLLM in-process (`--backend vllm`, the optional `vllm` extra on GPU hosts);
- `synth.batch.BatchBackend`: the OpenAI Batch API (`--backend batch`);
and `CachedBackend`, which puts the SQLite response cache in front of either.

So one generator config runs offline on a GPU host or against servers: only `teachers.<name>.backend`
changes. vLLM is imported lazily, only when a `vllm` backend starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from purokit.log import get_logger
from synth.cache import ResponseCache, cache_key
from synth.client import ChatClient, ChatRequest, ChatResult, EndpointPool, RequestRejected, TeacherConfig
from synth.toolcalls import hermes_server_parse

log = get_logger("synth.backends")


class Backend(Protocol):
    cfg: TeacherConfig

    async def start(self) -> None: ...
    async def complete(self, req: ChatRequest) -> ChatResult: ...
    async def close(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...


class HttpBackend:
    def __init__(self, cfg: TeacherConfig, seed: int = 0, pool: EndpointPool | None = None):
        self.cfg = cfg
        self.client = ChatClient(cfg, seed=seed, pool=pool)

    async def start(self) -> None:
        await self.client.wait_ready()

    async def complete(self, req: ChatRequest) -> ChatResult:
        return await self.client.complete(req)

    async def close(self) -> None:
        await self.client.close()

    async def served_info(self) -> dict[str, Any]:
        return await self.client.served_info()

    def stats(self) -> dict[str, Any]:
        return self.client.stats()


# ---- in-process vLLM --------------------------------------------------------------------------

VLLM_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "presence_penalty",
                      "frequency_penalty", "repetition_penalty", "min_p")


def vllm_sampling_kwargs(req: ChatRequest) -> dict[str, Any]:
    """`vllm.SamplingParams(**kwargs)` for a request: the same knobs the HTTP body carries.
    `logprobs=k` in vLLM returns the sampled token's logprob plus the top k (k=0: sampled only)."""
    kw = {k: req.params[k] for k in VLLM_SAMPLING_KEYS if req.params.get(k) is not None}
    if req.seed is not None:
        kw["seed"] = req.seed
    if req.logprobs:
        kw["logprobs"] = int(req.top_logprobs or 0)
    return kw


def result_from_vllm_output(output: Any, model: str, top_logprobs: bool) -> ChatResult:
    """A `vllm.RequestOutput` (duck-typed) as a ChatResult: the engine's own token ids, and for
    each sampled token the logprob vLLM reports for that id."""
    comp = output.outputs[0]
    ids = [int(t) for t in (comp.token_ids or [])]
    tokens = lps = None
    if comp.logprobs is not None:
        tokens, lps = [], []
        for tid, entry in zip(ids, comp.logprobs):
            lp = entry.get(tid) if isinstance(entry, dict) else None
            tokens.append(getattr(lp, "decoded_token", None) or "")
            lps.append(float(lp.logprob) if lp is not None else math.nan)
    prompt_ids = list(getattr(output, "prompt_token_ids", None) or [])
    return ChatResult(content=comp.text, finish_reason=comp.finish_reason, prompt_tokens=len(prompt_ids),
                      completion_tokens=len(ids), tokens=tokens, logprobs=lps, token_ids=ids,
                      prompt_token_ids=prompt_ids or None, model=model, endpoint="vllm-inprocess")


def apply_hermes_tool_calls(res: ChatResult, req: ChatRequest) -> None:
    """Parse `<tool_call>` blocks of an in-process completion into OpenAI tool calls, with the
    semantics of vLLM's `hermes` server parser (the Hermes/Qwen layout most tool-trained open
    models use); call ids are derived from the request, so a rerun gives the same ids."""
    content, calls = hermes_server_parse(res.content)
    if not calls:
        return
    base = hashlib.sha256(json.dumps([req.messages, req.seed], sort_keys=True, default=str).encode()).hexdigest()
    res.content = content or ""
    res.tool_calls = [{"id": f"call_{base[:12]}_{i}", "type": "function", "function": c} for i, c in enumerate(calls)]
    if res.finish_reason == "stop":
        res.finish_reason = "tool_calls"


class VllmBackend:
    """vLLM in-process. Requests are gathered for `batch_window_s` (or until `max_batch`) and run
    as one `LLM.chat` call in a worker thread, so the engine sees the concurrency it batches on.

    `llm_factory` builds the engine (default: `vllm.LLM(model=cfg.model, **cfg.vllm_engine_args)`);
    tests inject a stand-in, since vLLM's GPU build cannot run on a CPU-only machine.
    """

    def __init__(self, cfg: TeacherConfig, llm_factory: Callable[[], Any] | None = None,
                 max_batch: int = 256, batch_window_s: float = 0.02):
        self.cfg = cfg
        self._factory = llm_factory
        self._llm: Any = None
        self._sp_cls: Any = None
        self._structured_cls: Any = None
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._queue: asyncio.Queue[tuple[ChatRequest, asyncio.Future[ChatResult]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.n_requests = 0
        self.n_batches = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    async def start(self) -> None:
        if self._factory is None:
            try:
                vllm = importlib.import_module("vllm")
            except ImportError as e:
                raise RuntimeError("backend 'vllm' needs vLLM in this environment: pip install 'purokit[vllm]' "
                                   f"on a GPU host, or use backend 'openai' against a vLLM server ({e})") from None
            self._sp_cls = vllm.SamplingParams
            try:
                self._structured_cls = importlib.import_module("vllm.sampling_params").StructuredOutputsParams
            except (ImportError, AttributeError):
                self._structured_cls = None
            self._llm = await asyncio.to_thread(lambda: vllm.LLM(model=self.cfg.model, **self.cfg.vllm_engine_args))
        else:
            made = self._factory()
            self._llm, self._sp_cls = made if isinstance(made, tuple) else (made, dict)
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._run())

    def sampling_params(self, req: ChatRequest) -> Any:
        kw = vllm_sampling_kwargs(req)
        if req.json_schema is not None and self._structured_cls is not None:
            kw["structured_outputs"] = self._structured_cls(json=req.json_schema)
        return self._sp_cls(**kw)

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            try:
                async with asyncio.timeout(self.batch_window_s):
                    while len(batch) < self.max_batch:
                        batch.append(await self._queue.get())
            except TimeoutError:
                pass
            live = []
            for r, f in batch:
                if f.cancelled():
                    continue
                if r.tools and r.tool_choice not in (None, "auto", "none"):
                    f.set_exception(ValueError(
                        f"tool_choice={json.dumps(r.tool_choice)} needs a server (vllm serve --tool-call-parser ...): "
                        "the in-process backend renders the tools and parses <tool_call> blocks, it cannot force a call"))
                    continue
                live.append((r, f))
            # an assistant prefill and the tools are chat-level options of LLM.chat, so requests
            # that differ in them go in separate calls
            groups: dict[tuple[bool, str], list[tuple[ChatRequest, asyncio.Future[ChatResult]]]] = {}
            for r, f in live:
                tools_key = json.dumps(r.tools, sort_keys=True) if r.tools else ""
                groups.setdefault((bool(r.params.get("continue_final_message")), tools_key), []).append((r, f))
            for (prefill, tools_key), members in sorted(groups.items()):
                await self._generate(members, prefill, json.loads(tools_key) if tools_key else None)

    async def _generate(self, live: list[tuple[ChatRequest, "asyncio.Future[ChatResult]"]], prefill: bool,
                        tools: list[dict[str, Any]] | None = None) -> None:
            chat_kw: dict[str, Any] = {"use_tqdm": False}
            if prefill:
                chat_kw.update(continue_final_message=True, add_generation_prompt=False)
            if tools:
                chat_kw["tools"] = tools
            try:
                outs = await asyncio.to_thread(self._llm.chat, [r.messages for r, _ in live],
                                               [self.sampling_params(r) for r, _ in live], **chat_kw)
            except Exception as e:          # the whole batch failed: every caller sees why
                for _, f in live:
                    if not f.done():
                        f.set_exception(RuntimeError(f"vLLM in-process generation failed: {e}"))
                return
            self.n_batches += 1
            for (r, f), out in zip(live, outs):
                res = result_from_vllm_output(out, self.cfg.model, bool(r.top_logprobs))
                if r.tools and r.tool_choice != "none":
                    apply_hermes_tool_calls(res, r)
                self.n_requests += 1
                self.prompt_tokens += res.prompt_tokens
                self.completion_tokens += res.completion_tokens
                if not f.done():
                    f.set_result(res)

    async def served_info(self) -> dict[str, Any]:
        """The in-process engine's own config (vLLM's LLM.llm_engine.model_config), where it has one."""
        mc = getattr(getattr(self._llm, "llm_engine", None), "model_config", None)
        out: dict[str, Any] = {"engine": "vllm"} if self._factory is None else {}
        if mc is not None and getattr(mc, "dtype", None) is not None:
            out["precision"] = str(mc.dtype).removeprefix("torch.")
        if mc is not None and getattr(mc, "logprobs_mode", None):
            out["logprobs_mode"] = str(mc.logprobs_mode).rsplit(".", 1)[-1].lower()
        return out

    async def complete(self, req: ChatRequest) -> ChatResult:
        if self._queue is None:
            raise RuntimeError("VllmBackend.complete before start()")
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        await self._queue.put((req, fut))
        return await fut

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except (asyncio.CancelledError, Exception):
                pass
            self._worker = None

    def stats(self) -> dict[str, Any]:
        return {"n_requests": self.n_requests, "n_batches": self.n_batches, "n_retries": 0,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


# ---- cache in front -----------------------------------------------------------------------------

class CachedBackend:
    """Answers from the SQLite cache when it can; identical requests in flight share one call."""

    def __init__(self, inner: Any, cache: ResponseCache):
        self.inner = inner
        self.cfg: TeacherConfig = inner.cfg
        self.cache = cache
        self._inflight: dict[str, asyncio.Future[ChatResult]] = {}
        self.n_cached = 0
        self._started = False
        self._start_lock: asyncio.Lock | None = None

    async def start(self) -> None:
        await self.inner.start()
        self._started = True

    async def complete(self, req: ChatRequest) -> ChatResult:
        key = cache_key(req.cache_payload(self.cfg.model))
        hit = self.cache.get(key)
        if hit is not None:
            self.n_cached += 1
            res = ChatResult.from_json(hit)
            res.cached = True
            return res
        if key in self._inflight:
            return await asyncio.shield(self._inflight[key])
        fut: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            if not self._started:           # lazily: a fully cached rerun never probes the server
                if self._start_lock is None:
                    self._start_lock = asyncio.Lock()
                async with self._start_lock:
                    if not self._started:
                        await self.start()
            res = await self.inner.complete(req)
            self.cache.put(key, self.cfg.model, res.to_json())
            fut.set_result(res)
            return res
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()                 # consumed: waiters re-raise it themselves
            raise
        finally:
            del self._inflight[key]

    async def close(self) -> None:
        await self.inner.close()

    async def served_info(self) -> dict[str, Any]:
        """The endpoint's report about itself, once per model and kept with the answers, so a
        cached rerun writes the same records without the server."""
        key = cache_key({"probe": "served_info/1", "model": self.cfg.model})
        hit = self.cache.get(key)
        if hit is not None:
            return dict(hit)
        if not self._started:
            await self.start()
            self._started = True
        info = await self.inner.served_info()
        self.cache.put(key, self.cfg.model, info)
        return info

    def stats(self) -> dict[str, Any]:
        return dict(self.inner.stats(), n_cached=self.n_cached)


# ---- does this teacher call tools natively? ----------------------------------------------------

PROBE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}
PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@dataclass(frozen=True)
class ToolSupport:
    native: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"native": self.native, "reason": self.reason}


async def probe_tool_support(backend: Any) -> ToolSupport:
    """Whether `backend` serves native tool calls, found over the protocol: the same one-token
    request with and without `tools` (tool_choice "auto"). Native iff the endpoint accepts the
    tools *and* its prompt grows by them (the chat template renders them). A server without a
    tool parser rejects the request (vLLM: 400 '"auto" tool choice requires
    --enable-auto-tool-choice ...'); a model whose template ignores tools (SmolLM2's) accepts it
    but its prompt does not change, so the model would never see the tools."""
    params = {"temperature": 0.0, "max_tokens": 1}
    plain = ChatRequest(messages=PROBE_MESSAGES, params=params, seed=0, tag="tool-probe")
    with_tools = ChatRequest(messages=PROBE_MESSAGES, params=params, seed=0, tools=[PROBE_TOOL], tool_choice="auto",
                             tag="tool-probe")
    a = await backend.complete(plain)          # a rejection here is not about tools: let it surface
    try:
        b = await backend.complete(with_tools)
    except RequestRejected as e:
        return ToolSupport(False, f"the endpoint rejects requests with tools ({e})")
    if not (a.prompt_tokens and b.prompt_tokens):
        return ToolSupport(False, "the endpoint reports no prompt token counts, so tool rendering cannot be seen")
    if b.prompt_tokens <= a.prompt_tokens:
        return ToolSupport(False, f"the chat template ignores tools (prompt {a.prompt_tokens} tokens with and without)")
    return ToolSupport(True, f"tools accepted and rendered (prompt {a.prompt_tokens} -> {b.prompt_tokens} tokens)")


def tool_support_key(model: str) -> str:
    """Where the probe's verdict for `model` is kept in a run's response cache."""
    return cache_key({"probe": "tool_support/1", "model": model})


def cached_tool_support(cache: ResponseCache, model: str) -> ToolSupport | None:
    """The verdict a run recorded for `model`, if it probed."""
    hit = cache.get(tool_support_key(model))
    return ToolSupport(bool(hit["native"]), str(hit["reason"])) if hit is not None else None


async def tool_support(backend: Any) -> ToolSupport:
    """`probe_tool_support`, once per backend; behind the cache the verdict is stored with the
    answers (keyed by model), so a rerun from the cache does not need the server."""
    found = getattr(backend, "_tool_support", None)
    if found is not None:
        return found
    lock = backend.__dict__.setdefault("_tool_support_lock", asyncio.Lock())
    async with lock:
        if getattr(backend, "_tool_support", None) is None:
            cache = getattr(backend, "cache", None)
            verdict = cached_tool_support(cache, backend.cfg.model) if cache is not None else None
            source = "recorded in this run's cache; a new output directory probes again"
            if verdict is None:
                verdict = await probe_tool_support(backend)
                source = "probed"
                if cache is not None:
                    cache.put(tool_support_key(backend.cfg.model), backend.cfg.model, verdict.to_json())
            log.info("teacher %s: %s tool calls (%s; %s)", backend.cfg.model, "native" if verdict.native else "prompted",
                     verdict.reason, source)
            backend._tool_support = verdict
    return backend._tool_support


def make_backend(cfg: TeacherConfig, cache: ResponseCache | None, seed: int = 0,
                 llm_factory: Callable[[], Any] | None = None, pool: EndpointPool | None = None) -> Any:
    """The backend of one teacher role; roles given the same `pool` share each endpoint's
    limiter, breaker and Retry-After window."""
    inner: Any
    if cfg.backend == "openai":
        inner = HttpBackend(cfg, seed=seed, pool=pool)
    elif cfg.backend == "vllm":
        inner = VllmBackend(cfg, llm_factory=llm_factory)
    elif cfg.backend == "batch":
        if cache is None:
            raise ValueError(f"teacher '{cfg.model}': backend 'batch' journals its batches beside a run's cache")
        from synth.batch import JOURNAL_NAME, BatchBackend
        inner = BatchBackend(cfg, cache.path.parent / JOURNAL_NAME, seed=seed, pool=pool)
    else:
        raise ValueError(f"teacher '{cfg.model}': unknown backend {cfg.backend!r} (openai | batch | vllm)")
    return CachedBackend(inner, cache) if cache is not None else inner
