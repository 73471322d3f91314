"""A scripted OpenAI-compatible server on localhost: real HTTP/1.1 (keep-alive, JSON bodies,
server-sent-event streams), scripted answers, and the fault modes a teacher fleet shows in
practice: bursts of 429, 500s, requests that hang past the client's timeout, malformed JSON,
truncated streams and dropped connections.

It is a test double for a teacher LLM's *answers*, never for the protocol: the client under test
talks to it over sockets exactly as it talks to `vllm serve`. Used by tests/synth, the client
benchmark (`benchmarks/synth_client.py`, where it runs in its own process) and the demo's `ci`
profile when no vLLM environment is built.

    python -m synth.fakeserver --port 0 [--responder echo|arithmetic] [--latency-ms 0] [--parallel N]
    python -m synth.fakeserver --port 8000 --model teacher --responder scripted --script synth/scripts/teacher.yaml

prints `listening on http://127.0.0.1:PORT/v1` once it accepts connections.

Faults are rules; a request matches a rule by its global arrival number (`first_n`, `every`), by
which attempt it is for its content (`attempts`: 0 is the first time this exact body arrives), by
a deterministic hash-selected `fraction` of request bodies, or by a substring (`contains`) of the
body. The first matching rule applies.

Tool calling, as `vllm serve --enable-auto-tool-choice --tool-call-parser hermes` does it: a
request's `tools`/`tool_choice` and its assistant `tool_calls` / `role: tool` messages are
checked as OpenAI checks them (400 with the reason otherwise); a scripted answer is either text,
whose `<tool_call>` blocks the server parses with vLLM's hermes semantics when the request has
tools, or a dict with explicit `tool_calls` (`{"name", "arguments": object or text}`, or a raw
protocol entry, malformed on purpose if the test wants). The tools count in `prompt_tokens`, as
a chat template that renders them makes them. `tool_calling=False` answers like vLLM started
without a tool parser: 400 for a request with tools and tool_choice other than "none".

The OpenAI Batch API (`/v1/files`, `/v1/batches`) is served too, its lines answered by the same
chat path (synth.fakebatch).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import model_validator

from purokit.config import StrictModel, load_yaml, validate
from synth.fakebatch import BatchService
from synth.toolcalls import hermes_server_parse

FAULT_KINDS = ("429", "500", "503", "timeout", "malformed", "truncate", "drop", "400", "404")

Responder = Callable[[dict[str, Any]], "str | dict[str, Any]"]


@dataclass
class Fault:
    kind: str
    first_n: int | None = None          # requests 0..first_n-1 (global arrival order)
    every: int | None = None            # every k-th request (arrival number % k == k-1)
    attempts: list[int] | None = None   # these attempt numbers of each distinct body
    fraction: float | None = None       # hash-selected share of distinct bodies (all their attempts)
    contains: str | None = None         # only bodies containing this substring
    delay_s: float = 30.0               # for "timeout": how long to hang before closing
    retry_after_s: float | None = None  # for "429" / "503": the Retry-After header
    window_s: float | None = None       # only during the first window_s seconds after the server started

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(FAULT_KINDS)}")

    def matches(self, n: int, attempt: int, body_key: str, body: bytes, age_s: float = 0.0) -> bool:
        if self.window_s is not None and age_s >= self.window_s:
            return False
        if self.contains is not None and self.contains.encode() not in body:
            return False
        if self.first_n is not None and n >= self.first_n:
            return False
        if self.every is not None and (n % self.every) != self.every - 1:
            return False
        if self.attempts is not None and attempt not in self.attempts:
            return False
        if self.fraction is not None and int(body_key[:8], 16) / 0xFFFFFFFF >= self.fraction:
            return False
        return True


def _n_tokens(text: str) -> int:
    return max(1, len(text.split()))


def _token_id(tok: str) -> int:
    return int(hashlib.sha256(tok.encode()).hexdigest()[:6], 16) % 49152


def echo_responder(req: dict[str, Any]) -> str:
    """A deterministic answer from the request: its last user message's hash, seed and a constant."""
    msgs = req.get("messages") or []
    last = msgs[-1]["content"] if msgs else ""
    h = hashlib.sha256(f"{last}|{req.get('seed')}".encode()).hexdigest()[:8]
    return f"ok {h}"


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def arithmetic_responder(req: dict[str, Any]) -> str:
    """A scripted 'teacher' for arithmetic word problems: it states the numbers it saw and answers
    with their sum, product or difference depending on the wording, right or wrong as it happens.
    It follows the reasoning toggle: `<think>...</think>` under `detailed thinking on`."""
    msgs = req.get("messages") or []
    system = next((m["content"] for m in msgs if m.get("role") == "system"), "")
    user = next((m["content"] for m in reversed(msgs) if m.get("role") == "user"), "")
    nums = [float(x) for x in _NUM.findall(user)]
    low = user.lower()
    if not nums:
        ans = 0.0
    elif any(w in low for w in ("times", "each", "per", "every")) and len(nums) >= 2:
        ans = math.prod(nums[:2])
    elif any(w in low for w in ("left", "gives away", "loses", "spent", "eats", "remain")) and len(nums) >= 2:
        ans = nums[0] - sum(nums[1:])
    else:
        ans = sum(nums)
    seed = req.get("seed") or 0
    if seed % 5 == 4:       # some samples are wrong, so verification has something to reject
        ans += 1
    ans_s = str(int(ans)) if float(ans).is_integer() else f"{ans:g}"
    if "thinking on" in system:
        return f"<think>\nThe numbers are {', '.join(f'{n:g}' for n in nums)}. Combining them gives {ans_s}.\n</think>\nThe answer is \\boxed{{{ans_s}}}."
    return f"The answer is \\boxed{{{ans_s}}}."


RESPONDERS: dict[str, Responder] = {"echo": echo_responder, "arithmetic": arithmetic_responder}


class ScriptRule(StrictModel):
    """One rule of a script: when `match` (a regular expression, searched in the last user message,
    or the system message, or both) is found, answer with `reply` text and/or `tool_calls`
    (`{name, arguments}`), `reasoning_content` (as a reasoning parser splits it off), or hand the
    request to a built-in `responder` (arithmetic, echo)."""

    match: str = ""
    # where to search: the last user message, the system message, the last message of any role
    # (a tool result), the request's tool definitions (JSON), or system + last user
    where: Literal["user", "system", "last", "tools", "any"] = "user"
    tools: bool | None = None               # only requests with (true) / without (false) tools
    seed: Literal["even", "odd"] | None = None   # only requests whose seed is even / odd (samples that differ)
    expand: bool = False                    # `reply` uses the match's groups (\\1, \\g<name>)
    reply: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    responder: str | None = None
    name: str = ""

    @model_validator(mode="after")
    def _one_answer(self) -> "ScriptRule":
        if self.reply is None and self.tool_calls is None and self.responder is None:
            raise ValueError("a rule needs reply, tool_calls or responder")
        if self.responder is not None and self.responder not in RESPONDERS:
            raise ValueError(f"unknown responder {self.responder!r} (known: {', '.join(sorted(RESPONDERS))})")
        re.compile(self.match)
        return self


class Script(StrictModel):
    """`python -m synth.fakeserver --responder scripted --script FILE`: a YAML file of rules, the
    first match answers; requests no rule matches get `default`."""

    rules: list[ScriptRule]
    default: str = "I do not know."


class ScriptedResponder:
    """A teacher that answers from a `Script`; `hits` counts what each rule answered."""

    def __init__(self, script: Script):
        self.script = script
        self._patterns = [re.compile(r.match, re.S) for r in script.rules]
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path) -> "ScriptedResponder":
        return cls(validate(Script, load_yaml(path), path))

    def __call__(self, req: dict[str, Any]) -> str | dict[str, Any]:
        msgs = req.get("messages") or []
        user = next((str(m.get("content") or "") for m in reversed(msgs) if m.get("role") == "user"), "")
        system = next((str(m.get("content") or "") for m in msgs if m.get("role") == "system"), "")
        for i, (rule, pat) in enumerate(zip(self.script.rules, self._patterns)):
            if rule.tools is not None and bool(req.get("tools")) != rule.tools:
                continue
            if rule.seed is not None and (int(req.get("seed") or 0) % 2 == 0) != (rule.seed == "even"):
                continue
            hay = {"user": user, "system": system, "any": system + "\n" + user,
                   "last": str((msgs[-1].get("content") if msgs else "") or ""),
                   "tools": json.dumps(req.get("tools") or [])}[rule.where]
            m = pat.search(hay)
            if m is None:
                continue
            with self._lock:
                key = rule.name or f"rule {i}"
                self.hits[key] = self.hits.get(key, 0) + 1
            if rule.responder is not None:
                return RESPONDERS[rule.responder](req)
            out: dict[str, Any] = {"content": m.expand(rule.reply) if rule.expand and rule.reply else rule.reply}
            if rule.tool_calls is not None:
                out["tool_calls"] = rule.tool_calls
            if rule.reasoning_content is not None:
                out["reasoning_content"] = rule.reasoning_content
            return out
        return self.script.default


@dataclass
class ServerStats:
    n_requests: int = 0
    n_faults: dict[str, int] = field(default_factory=dict)
    inflight: int = 0
    max_inflight: int = 0               # the most chat requests answered at once
    n_batch_lines: int = 0              # requests answered as lines of a batch
    bodies: list[dict[str, Any]] = field(default_factory=list)


class FakeOpenAIServer:
    """`with FakeOpenAIServer(responder, faults) as srv: srv.base_url` runs it in a thread."""

    def __init__(self, responder: Responder | str = "echo", faults: list[Fault] | None = None,
                 model: str = "fake-teacher", host: str = "127.0.0.1", port: int = 0,
                 latency_s: float = 0.0, record_bodies: bool = True, tool_calling: bool = True,
                 served_info: dict[str, Any] | None = None, parallel: int | None = None):
        self.responder: Responder = RESPONDERS[responder] if isinstance(responder, str) else responder
        self.faults = list(faults or [])
        self.model = model
        self.host = host
        self.port = port
        self.latency_s = latency_s
        # a saturated teacher: `parallel` requests are answered in latency_s; with more in flight
        # each answer takes latency_s * inflight / parallel (a batch that no longer grows shares
        # the same tokens/s among more requests), so total throughput stays flat
        self.parallel = parallel
        self.record_bodies = record_bodies
        self.tool_calling = tool_calling
        self.stats = ServerStats()
        self._attempts: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self.served_info = dict(served_info or {})
        self.batch = BatchService(self._batch_line)     # /v1/files and /v1/batches
        self._t0 = time.monotonic()

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def serve(self, ready: Callable[[], None] | None = None) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        if ready:
            ready()
        async with self._server:
            await self._server.serve_forever()

    def start(self) -> "FakeOpenAIServer":
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self.serve(self._ready.set))
            except asyncio.CancelledError:
                pass
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake OpenAI server did not start within 10 s")
        return self

    def stop(self) -> None:
        if self._loop and self._server:
            def _close() -> None:
                assert self._server is not None
                self._server.close()
                for task in asyncio.all_tasks(self._loop):
                    task.cancel()
            self._loop.call_soon_threadsafe(_close)
        if self._thread:
            self._thread.join(10)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- HTTP --------------------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = await self._dispatch(method, path.split("?")[0], body, writer, headers)
                if not keep or headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            try:
                writer.close()
            except Exception:
                pass

    @staticmethod
    def _response(status: int, body: bytes, content_type: str = "application/json",
                  extra: dict[str, str] | None = None) -> bytes:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Error")
        hdr = [f"HTTP/1.1 {status} {reason}", f"content-type: {content_type}",
               f"content-length: {len(body)}"]
        for k, v in (extra or {}).items():
            hdr.append(f"{k}: {v}")
        return ("\r\n".join(hdr) + "\r\n\r\n").encode() + body

    async def _dispatch(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter,
                        headers: dict[str, str] | None = None) -> bool:
        if path.startswith(("/v1/files", "/v1/batches")):
            status, payload = self._batch_api(method, path, body, (headers or {}).get("content-type", ""))
            ctype = "application/octet-stream" if isinstance(payload, bytes) else "application/json"
            writer.write(self._response(status, payload if isinstance(payload, bytes) else json.dumps(payload).encode(),
                                        content_type=ctype))
            await writer.drain()
            return True
        if method == "GET" and path in ("/v1/models", "/models"):
            owner = self.served_info.get("owned_by", "purokit-fake")
            data = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": owner}]}
            writer.write(self._response(200, json.dumps(data).encode()))
            await writer.drain()
            return True
        if method == "GET" and path in ("/version", "/server_info") and self.served_info:
            # what `vllm serve` reports about itself (/server_info: with VLLM_SERVER_DEV_MODE=1)
            info = self.served_info
            data = ({"version": info.get("version", "0")} if path == "/version" else
                    {"vllm_config": {"model_config": {k: info[k] for k in ("dtype", "logprobs_mode") if k in info}}})
            writer.write(self._response(200, json.dumps(data).encode()))
            await writer.drain()
            return True
        if method == "GET" and path in ("/health", "/v1/health"):
            writer.write(self._response(200, b"{}"))
            await writer.drain()
            return True
        if method != "POST" or path not in ("/v1/chat/completions", "/chat/completions"):
            writer.write(self._response(404, json.dumps({"error": {"message": f"no route {method} {path}"}}).encode()))
            await writer.drain()
            return True

        key = hashlib.sha256(body).hexdigest()
        with self._lock:
            n = self.stats.n_requests
            self.stats.n_requests += 1
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
        age = time.monotonic() - self._t0
        fault = next((f for f in self.faults if f.matches(n, attempt, key, body, age)), None)
        try:
            req = json.loads(body)
        except json.JSONDecodeError:
            writer.write(self._response(400, b'{"error":{"message":"body is not JSON"}}'))
            await writer.drain()
            return True
        if self.record_bodies:
            with self._lock:
                self.stats.bodies.append(req)
        if req.get("model") != self.model:
            msg = {"error": {"message": f"The model `{req.get('model')}` does not exist.", "type": "NotFoundError", "code": 404}}
            writer.write(self._response(404, json.dumps(msg).encode()))
            await writer.drain()
            return True
        problem = request_problem(req, self.tool_calling)
        if problem is not None:
            msg = {"error": {"message": problem, "type": "BadRequestError", "code": 400}}
            writer.write(self._response(400, json.dumps(msg).encode()))
            await writer.drain()
            return True
        if fault is not None:
            with self._lock:
                self.stats.n_faults[fault.kind] = self.stats.n_faults.get(fault.kind, 0) + 1
            return await self._fault(fault, req, writer)
        with self._lock:
            self.stats.inflight += 1
            self.stats.max_inflight = max(self.stats.max_inflight, self.stats.inflight)
        try:
            if self.latency_s:
                await asyncio.sleep(self.latency_s * max(1.0, self.stats.inflight / (self.parallel or math.inf)))
            if req.get("stream"):
                await self._stream(req, writer, truncate=False)
            else:
                writer.write(self._response(200, json.dumps(self._completion(req)).encode()))
                await writer.drain()
        finally:
            with self._lock:
                self.stats.inflight -= 1
        return True

    def _batch_api(self, method: str, path: str, body: bytes, content_type: str) -> tuple[int, Any]:
        """The Batch API routes (synth.fakebatch); a file's content is returned as bytes."""
        b = self.batch
        parts = path.strip("/").split("/")             # v1, files|batches, id?, content|cancel?
        if parts[1] == "files":
            if method == "POST" and len(parts) == 2:
                return b.upload(content_type, body)
            fid = parts[2] if len(parts) > 2 else ""
            if fid not in b.files:
                return 404, {"error": {"message": f"No such File object: {fid}", "type": "invalid_request_error"}}
            return (200, b.contents[fid]) if parts[-1] == "content" else (200, b.files[fid])
        if method == "POST" and len(parts) == 2:
            try:
                return b.create(json.loads(body))
            except json.JSONDecodeError:
                return 400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}}
        if method == "GET" and len(parts) == 2:
            return 200, b.listing()
        if method == "POST" and parts[-1] == "cancel":
            return b.cancel(parts[2])
        return b.retrieve(parts[2])

    def _batch_line(self, req: dict[str, Any], raw: bytes) -> tuple[int, dict[str, Any]]:
        """One batch line through the chat path: (HTTP status, body) as an online request would get."""
        key = hashlib.sha256(raw).hexdigest()
        with self._lock:
            n = self.stats.n_requests
            self.stats.n_requests += 1
            self.stats.n_batch_lines += 1
            attempt = self._attempts.get(key, 0)
            self._attempts[key] = attempt + 1
        if req.get("model") != self.model:
            return 404, {"error": {"message": f"The model `{req.get('model')}` does not exist.", "type": "NotFoundError"}}
        problem = request_problem(req, self.tool_calling)
        if problem is not None:
            return 400, {"error": {"message": problem, "type": "BadRequestError"}}
        fault = next((f for f in self.faults if f.matches(n, attempt, key, raw, time.monotonic() - self._t0)), None)
        if fault is not None:
            with self._lock:
                self.stats.n_faults[fault.kind] = self.stats.n_faults.get(fault.kind, 0) + 1
            code = int(fault.kind) if fault.kind.isdigit() else 500
            return code, {"error": {"message": f"scripted fault {fault.kind}", "type": "fault", "code": code}}
        return 200, self._completion(req)

    async def _fault(self, fault: Fault, req: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        k = fault.kind
        if k in ("429", "500", "503", "400", "404"):
            extra = {"retry-after": f"{fault.retry_after_s:g}"} if (k in ("429", "503") and fault.retry_after_s is not None) else None
            msg = {"error": {"message": f"scripted fault {k}", "type": "fault", "code": int(k)}}
            writer.write(self._response(int(k), json.dumps(msg).encode(), extra=extra))
            await writer.drain()
            return True
        if k == "timeout":
            await asyncio.sleep(fault.delay_s)
            return False
        if k == "malformed":
            writer.write(self._response(200, b'{"id": "x", "choices": [{"message": {"content": "unterminated'))
            await writer.drain()
            return True
        if k == "truncate":
            if req.get("stream"):
                await self._stream(req, writer, truncate=True)
                return False
            full = json.dumps(self._completion(req)).encode()
            head = self._response(200, full)
            writer.write(head[: len(head) - len(full) // 2])     # promise the whole body, send half
            await writer.drain()
            return False
        if k == "drop":
            return False                                      # close without a byte of response
        raise AssertionError(k)

    def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        out = self.responder(req)
        ans = {"content": out} if isinstance(out, str) else dict(out)
        ans.setdefault("content", None)
        msgs = req.get("messages") or []
        if req.get("continue_final_message") and msgs and msgs[-1].get("role") == "assistant":
            # the reply continues the given start of the assistant turn (vLLM semantics)
            start = msgs[-1].get("content") or ""
            if (ans["content"] or "").startswith(start):
                ans["content"] = ans["content"][len(start):]
        parse_tools = bool(req.get("tools")) and self.tool_calling and req.get("tool_choice") != "none"
        if "tool_calls" not in ans and parse_tools and ans["content"]:
            ans["content"], calls = hermes_server_parse(ans["content"])
            if calls:
                ans["tool_calls"] = calls
        if ans.get("tool_calls"):
            ans["tool_calls"] = [self._protocol_call(req, i, c) for i, c in enumerate(ans["tool_calls"])]
            named = isinstance(req.get("tool_choice"), dict)
            ans.setdefault("finish_reason", "stop" if named else "tool_calls")   # as vLLM reports them
        else:
            ans.pop("tool_calls", None)
            ans["content"] = ans["content"] or ""
        return ans

    @staticmethod
    def _protocol_call(req: dict[str, Any], i: int, c: Any) -> Any:
        """A scripted call ({"name", "arguments": object or text, "id"?}) in the protocol's shape;
        a raw entry (one with a "function" key, or not a dict) is sent as scripted."""
        if not isinstance(c, dict) or "function" in c:
            return c
        args = c.get("arguments", {})
        cid = c.get("id") or "call_" + hashlib.sha256(f"{json.dumps(req, sort_keys=True)}|{i}".encode()).hexdigest()[:16]
        return {"id": cid, "type": "function", "function": {
            "name": c.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}

    def _logprobs(self, req: dict[str, Any], tokens: list[str]) -> dict[str, Any] | None:
        if not req.get("logprobs"):
            return None
        as_ids = bool(req.get("return_tokens_as_token_ids"))
        content = []
        for i, t in enumerate(tokens):
            lp = -((int(hashlib.sha256(f"{t}{i}".encode()).hexdigest()[:4], 16) % 1000) / 400.0)
            tok = f"token_id:{_token_id(t)}" if as_ids else t
            content.append({"token": tok, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []})
        return {"content": content}

    def _completion(self, req: dict[str, Any]) -> dict[str, Any]:
        ans = self._answer(req)
        calls = ans.get("tool_calls")
        text = ans["content"]
        # the sampled text: content, then each call as the model wrote it
        call_text = "".join(json.dumps(c.get("function") if isinstance(c, dict) else c) for c in calls or [])
        tokens = re.findall(r"\S+\s*|\s+", (text or "") + call_text) or [""]
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens")
        finish = ans.get("finish_reason", "stop")
        if max_tokens and len(tokens) > max_tokens and not calls:
            tokens = tokens[:max_tokens]
            text = "".join(tokens)
            finish = "length"
        prompt_text = " ".join(str(m.get("content", "")) for m in req.get("messages") or [])
        if req.get("tools") and (self.tool_calling or req.get("tool_choice") == "none"):
            prompt_text += " " + " ".join(json.dumps(t) for t in req["tools"])    # the template renders them
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        for f in ("reasoning_content", "reasoning"):    # a reasoning parser's split-off thinking
            if ans.get(f):
                message[f] = ans[f]
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": finish, "logprobs": self._logprobs(req, tokens)}
        resp: dict[str, Any] = {
            "id": "chatcmpl-" + hashlib.sha256(json.dumps(req, sort_keys=True).encode()).hexdigest()[:12],
            "object": "chat.completion", "created": int(time.time()), "model": self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": _n_tokens(prompt_text), "completion_tokens": len(tokens),
                      "total_tokens": _n_tokens(prompt_text) + len(tokens)},
        }
        if req.get("return_token_ids"):
            choice["token_ids"] = [_token_id(t) for t in tokens]
            resp["prompt_token_ids"] = [_token_id(t) for t in prompt_text.split()]
        return resp

    async def _stream(self, req: dict[str, Any], writer: asyncio.StreamWriter, truncate: bool) -> None:
        full = self._completion(req)
        text = full["choices"][0]["message"]["content"] or ""
        tokens = re.findall(r"\S+\s*|\s+", text) or [""]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def chunk(payload: str) -> bytes:
            data = f"data: {payload}\n\n".encode()
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        lp = full["choices"][0].get("logprobs")
        message = full["choices"][0]["message"]
        for f in ("reasoning_content", "reasoning"):       # thinking streams first, in pieces
            thought = message.get(f) or ""
            for j in range(0, len(thought), 16):
                writer.write(chunk(json.dumps({"id": full["id"], "object": "chat.completion.chunk", "model": self.model,
                                               "choices": [{"index": 0, "delta": {f: thought[j:j + 16]},
                                                            "finish_reason": None}]})))
        for i, t in enumerate(tokens):
            if truncate and i >= max(1, len(tokens) // 2):
                await writer.drain()
                return                                           # connection closes mid-stream
            delta = {"id": full["id"], "object": "chat.completion.chunk", "model": self.model,
                     "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None,
                                  "logprobs": {"content": [lp["content"][i]]} if lp else None}]}
            writer.write(chunk(json.dumps(delta)))
        for i, c in enumerate(full["choices"][0]["message"].get("tool_calls") or []):
            # as OpenAI streams a call: id and name first, then the arguments in pieces
            fn = c.get("function") or {}
            args = fn.get("arguments") or ""
            head = {"index": i, "id": c.get("id"), "type": "function", "function": {"name": fn.get("name"), "arguments": ""}}
            pieces = [args[j:j + 8] for j in range(0, len(args), 8)]
            for d in [head] + [{"index": i, "function": {"arguments": p}} for p in pieces]:
                writer.write(chunk(json.dumps({"id": full["id"], "object": "chat.completion.chunk", "model": self.model,
                                               "choices": [{"index": 0, "delta": {"tool_calls": [d]}, "finish_reason": None}]})))
        last = {"id": full["id"], "object": "chat.completion.chunk", "model": self.model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": full["choices"][0]["finish_reason"]}]}
        writer.write(chunk(json.dumps(last)))
        if (req.get("stream_options") or {}).get("include_usage"):
            writer.write(chunk(json.dumps({"id": full["id"], "object": "chat.completion.chunk", "model": self.model,
                                           "choices": [], "usage": full["usage"]})))
        writer.write(chunk("[DONE]"))
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def request_problem(req: dict[str, Any], tool_calling: bool = True) -> str | None:
    """Why OpenAI (or vLLM) would answer this chat request with a 400, or None. Checks the tool
    protocol: tool definitions, tool_choice, assistant tool_calls and that every tool message
    answers a call of an earlier assistant message."""
    tools = req.get("tools")
    names: set[str] = set()
    if tools is not None:
        if not isinstance(tools, list):
            return "'tools' must be a list"
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str) or not fn["name"]:
                return f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}"
            if "parameters" in fn and not isinstance(fn["parameters"], dict):
                return f"tools[{i}].function.parameters must be a JSON schema object"
            names.add(fn["name"])
    choice = req.get("tool_choice")
    if choice is not None:
        if not tools:
            return "When using `tool_choice`, `tools` must be set."
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if name not in names:
                return f"tool_choice names no tool of the request: {json.dumps(choice)[:120]}"
        elif choice not in ("auto", "none", "required"):
            return f"Invalid value for `tool_choice`: {choice!r}"
    if tools and not tool_calling and (choice or "auto") != "none":
        # vLLM started without --enable-auto-tool-choice / --tool-call-parser
        return ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
                if (choice or "auto") == "auto" else "tool_choice requires --tool-call-parser to be set")
    pending: set[str] = set()
    for i, m in enumerate(req.get("messages") or []):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
            return f"messages[{i}]: unknown role {m.get('role') if isinstance(m, dict) else m!r}"
        if m["role"] == "assistant":
            for j, c in enumerate(m.get("tool_calls") or []):
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str) \
                        or not isinstance(fn.get("arguments"), str):
                    return f"messages[{i}].tool_calls[{j}]: needs id, type 'function', function.name and function.arguments (text)"
                pending.add(c["id"])
            if m.get("content") is None and not m.get("tool_calls"):
                return f"messages[{i}]: an assistant message needs content or tool_calls"
        elif m["role"] == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or cid not in pending:
                return (f"messages[{i}]: messages with role 'tool' must be a response to a preceding message with "
                        f"'tool_calls' (tool_call_id {cid!r})")
            if not isinstance(m.get("content"), str):
                return f"messages[{i}]: a tool message needs content (text)"
        elif not isinstance(m.get("content"), (str, list)):
            return f"messages[{i}]: a {m['role']} message needs content"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m synth.fakeserver", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="fake-teacher")
    ap.add_argument("--responder", default="echo", choices=sorted(RESPONDERS) + ["scripted"])
    ap.add_argument("--script", help="the YAML script of --responder scripted (rules: match -> reply, tool_calls, "
                                     "reasoning_content)")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    ap.add_argument("--parallel", type=int, default=None,
                    help="requests answered at full speed at once; more in flight share its throughput "
                         "(latency-ms x in flight / parallel each)")
    ap.add_argument("--no-tool-calling", action="store_true", help="answer requests with tools as vLLM without a tool parser (400)")
    ap.add_argument("--fault", action="append", default=[],
                    help='a fault rule as JSON, e.g. \'{"kind": "429", "first_n": 100}\'')
    args = ap.parse_args(argv)
    if (args.responder == "scripted") != bool(args.script):
        ap.error("--responder scripted and --script FILE go together")
    srv = FakeOpenAIServer(ScriptedResponder.from_file(args.script) if args.script else args.responder, [Fault(**json.loads(f)) for f in args.fault], model=args.model,
                           host=args.host, port=args.port, latency_s=args.latency_ms / 1000, record_bodies=False,
                           tool_calling=not args.no_tool_calling, parallel=args.parallel)

    def ready() -> None:
        print(f"listening on {srv.base_url}", flush=True)

    try:
        asyncio.run(srv.serve(ready))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
