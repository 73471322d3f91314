"""`backend: batch`: a teacher's requests through the OpenAI Batch API (`/v1/files` +
`/v1/batches`), at the Batch API's price, for any generator.

Requests are collected while the run produces them; when none has arrived for `batch_collect_s`
(every prompt in flight is waiting for an answer: one pipeline stage is complete) they are written
as Batch API JSONL, one line per request with its cache key as `custom_id`, uploaded, and a batch
is created; the batch id is journaled (`batches.jsonl` beside the cache) before anything waits on
it. The batch is polled with backoff (`batch_poll_s` doubling to `batch_poll_max_s`); its output
and error files are read back and each answer goes to the step that asked, into the same records,
cache and manifest as the online path. A multi-stage generator makes one batch per stage.

Resume: a killed run journaled every batch it created. The rerun asks for the same requests (same
seeds, same cache keys); a key found in a journaled batch waits on that batch (polled again, by
id) instead of going into a new one, so nothing is submitted twice.

Failed lines (an error file entry: a non-200 line, `batch_expired` when the window ran out, a
batch that `failed` validation or was cancelled) are sent online through the teacher's endpoints
(`batch_failed: online`, the default) or fail their prompt with the line's reason (`report`: the
run ends partial and the next run puts them in a new batch). Uses the official `openai` client.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from purokit.log import get_logger
from synth.cache import cache_key
from synth.client import (ChatClient, ChatRequest, ChatResult, EndpointError, EndpointNotReady, EndpointPool,
                          MalformedResponse, RequestRejected, RetriesExhausted, TeacherConfig, TransportError,
                          parse_chat_response, request_body)

log = get_logger("synth.batch")

BATCH_ENDPOINT = "/v1/chat/completions"
TERMINAL = ("completed", "failed", "expired", "cancelled")
JOURNAL_NAME = "batches.jsonl"


# ---- pure pieces ------------------------------------------------------------------------------

def batch_line(custom_id: str, model: str, req: ChatRequest, constrained_output: str = "json_schema") -> str:
    """One request of a batch input file: the body the online path would POST."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": BATCH_ENDPOINT,
                       "body": request_body(model, req, constrained_output=constrained_output)},
                      ensure_ascii=False, sort_keys=True) + "\n"


def line_outcomes(output_text: str, error_text: str) -> dict[str, dict[str, Any]]:
    """custom_id -> the line of the output or error file that answers it."""
    out: dict[str, dict[str, Any]] = {}
    for text in (output_text, error_text):
        for raw in text.splitlines():
            if raw.strip():
                line = json.loads(raw)
                out[line["custom_id"]] = line
    return out


def line_failure(line: dict[str, Any] | None, batch: dict[str, Any]) -> str | None:
    """Why a batch line holds no answer (None when it holds one)."""
    if line is None:
        errs = ((batch.get("errors") or {}).get("data") or [])
        why = "; ".join(f"{e.get('code')}: {e.get('message')}" + (f" (line {e['line']})" if e.get("line") else "")
                        for e in errs)
        return f"batch {batch['id']} ended {batch['status']} without this line" + (f" ({why})" if why else "")
    resp = line.get("response") or {}
    if line.get("error"):
        return f"{line['error'].get('code')}: {line['error'].get('message')}"
    if resp.get("status_code") != 200:
        msg = ((resp.get("body") or {}).get("error") or {}).get("message", "")
        return f"HTTP {resp.get('status_code')}: {msg}"
    return None


def poll_delays(first_s: float, max_s: float):
    """first_s, 2*first_s, ... capped at max_s: a batch takes minutes to hours, polls stay cheap."""
    d = first_s
    while True:
        yield d
        d = min(max_s, d * 2)


# ---- the journal ------------------------------------------------------------------------------

class BatchJournal:
    """`batches.jsonl`: one line per created batch (id, input file, the custom ids in it), written
    with one O_APPEND write and fsynced before the run waits on the batch."""

    def __init__(self, path: Path):
        self.path = path
        self.batch_of: dict[str, str] = {}          # custom_id -> batch id
        self.entries: dict[str, dict[str, Any]] = {}
        if path.exists():
            for raw in path.read_text(encoding="utf-8").splitlines():
                try:
                    e = json.loads(raw)
                except json.JSONDecodeError:        # a torn last line: that batch was never waited on
                    continue
                self.entries[e["batch_id"]] = e
                for k in e["custom_ids"]:
                    self.batch_of[k] = e["batch_id"]

    def add(self, batch_id: str, input_file_id: str, model: str, custom_ids: list[str]) -> None:
        e = {"batch_id": batch_id, "input_file_id": input_file_id, "model": model, "custom_ids": custom_ids,
             "created": time.time()}
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(e, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.entries[batch_id] = e
        for k in custom_ids:
            self.batch_of[k] = batch_id


# ---- the backend ------------------------------------------------------------------------------

@dataclass
class _Watch:
    """One batch being waited on: the task that polls it to the end and reads its files."""
    batch_id: str
    task: asyncio.Task[tuple[dict[str, Any], dict[str, dict[str, Any]]]]
    resumed: bool                             # created by an earlier run


@dataclass
class _Queued:
    key: str
    req: ChatRequest
    fut: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class BatchBackend:
    def __init__(self, cfg: TeacherConfig, journal_path: Path, seed: int = 0, pool: EndpointPool | None = None):
        if not cfg.endpoints:
            raise ValueError(f"teacher '{cfg.model}' (backend batch) has no endpoints: give the API's base URL")
        self.cfg = cfg
        self.journal = BatchJournal(journal_path)
        self._seed, self._pool = seed, pool
        self._online: ChatClient | None = None
        self._api: Any = None
        self._queue: list[_Queued] = []
        self._last_enqueue = 0.0
        self._flusher: asyncio.Task[None] | None = None
        self._watches: dict[str, _Watch] = {}
        self.n_requests = self.n_batched = self.n_online = self.n_failed_lines = 0
        self.prompt_tokens = self.completion_tokens = 0
        self.batches_created: list[str] = []
        self.batches_resumed: list[str] = []

    async def start(self) -> None:
        try:
            from openai import AsyncOpenAI
        except ImportError as e:            # a dependency of purokit; named in case an install lacks it
            raise RuntimeError(f"backend 'batch' needs the openai package: pip install openai ({e})") from None
        key = os.environ.get(self.cfg.api_key_env, "") if self.cfg.api_key_env else "EMPTY"
        if not key:
            raise EndpointNotReady(f"teacher '{self.cfg.model}': environment variable {self.cfg.api_key_env} is not set")
        self._api = AsyncOpenAI(base_url=self.cfg.endpoints[0], api_key=key, max_retries=self.cfg.max_retries,
                                timeout=60.0)

    # ---- requests -----------------------------------------------------------------------------
    async def complete(self, req: ChatRequest) -> ChatResult:
        key = cache_key(req.cache_payload(self.cfg.model))
        bid = self.journal.batch_of.get(key)
        if bid is not None and bid not in self.batches_created:
            # journaled by an earlier run: wait on that batch, by id, instead of sending it again
            batch, lines = await self._watch(bid, resumed=True).task
            if line_failure(lines.get(key), batch) is None:
                return self._answer(lines[key])
            # it failed there; that run handled it (online or reported): this one tries a new batch
        q = _Queued(key, req)
        self._queue.append(q)
        self._last_enqueue = time.monotonic()
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_when_idle())
        bid = await asyncio.shield(q.fut)
        batch, lines = await self._watches[bid].task
        why = line_failure(lines.get(key), batch)
        if why is None:
            return self._answer(lines[key])
        self.n_failed_lines += 1
        if self.cfg.batch_failed == "online":
            log.info("batch %s, line %s: %s; sending it online", bid, key[:12], why)
            self.n_online += 1
            res = await self._online_client().complete(req)
            self._count(res)
            return res
        raise RetriesExhausted(EndpointError(self.cfg.endpoints[0], f"batch {bid}, line {key[:12]}: {why}"), 1)

    def _answer(self, line: dict[str, Any]) -> ChatResult:
        try:
            res = parse_chat_response(self.cfg.endpoints[0], line["response"]["body"])
        except MalformedResponse as e:
            raise RetriesExhausted(e, 1) from None
        self.n_batched += 1
        self._count(res)
        return res

    def _count(self, res: ChatResult) -> None:
        self.n_requests += 1
        self.prompt_tokens += res.prompt_tokens
        self.completion_tokens += res.completion_tokens

    def _online_client(self) -> ChatClient:
        if self._online is None:
            self._online = ChatClient(self.cfg, seed=self._seed, pool=self._pool)
        return self._online

    # ---- submitting ---------------------------------------------------------------------------
    async def _flush_when_idle(self) -> None:
        """Submit what is queued once no request has arrived for batch_collect_s."""
        while self._queue:
            idle = time.monotonic() - self._last_enqueue
            if idle < self.cfg.batch_collect_s and len(self._queue) < self.cfg.batch_max_requests:
                await asyncio.sleep(self.cfg.batch_collect_s - idle)
                continue
            part, self._queue = self._queue[: self.cfg.batch_max_requests], self._queue[self.cfg.batch_max_requests:]
            try:
                bid = await self._submit(part)
            except Exception as e:
                if not isinstance(e, RequestRejected):
                    # the API refused the upload or the batch (key, quota, endpoint): say where
                    e = RequestRejected(self.cfg.endpoints[0], f"submitting a batch of {len(part)} requests failed: "
                                        f"{type(e).__name__}: {e}")
                for q in part:
                    if not q.fut.done():
                        q.fut.set_exception(e)
                        q.fut.exception()
                continue
            except BaseException:                # cancelled (the run ends): nobody waits any more
                for q in part:
                    q.fut.cancel()
                raise
            for q in part:
                q.fut.set_result(bid)

    async def _submit(self, part: list[_Queued]) -> str:
        seen: dict[str, _Queued] = {}
        for q in part:
            seen.setdefault(q.key, q)            # identical requests: one line, every asker answered
        data = "".join(batch_line(k, self.cfg.model, q.req, self.cfg.constrained_output) for k, q in seen.items())
        upload = await self._api.files.create(file=(f"purokit-{self.cfg.model}-{len(seen)}.jsonl", data.encode()),
                                              purpose="batch")
        batch = await self._api.batches.create(input_file_id=upload.id, endpoint=BATCH_ENDPOINT,
                                               completion_window=self.cfg.batch_completion_window,
                                               metadata={"source": "purokit", "model": self.cfg.model[:64]})
        self.journal.add(batch.id, upload.id, self.cfg.model, list(seen))
        self.batches_created.append(batch.id)
        log.info("teacher %s: batch %s created with %d requests (input file %s); journaled in %s",
                 self.cfg.model, batch.id, len(seen), upload.id, self.journal.path)
        self._watch(batch.id, resumed=False)
        return batch.id

    # ---- waiting ------------------------------------------------------------------------------
    def _watch(self, bid: str, resumed: bool) -> _Watch:
        if bid not in self._watches:
            if resumed:
                self.batches_resumed.append(bid)
                log.info("teacher %s: resuming batch %s from %s", self.cfg.model, bid, self.journal.path)
            self._watches[bid] = _Watch(bid, asyncio.create_task(self._wait(bid)), resumed)
        return self._watches[bid]

    async def _wait(self, bid: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Poll until the batch ends; (batch, custom_id -> output or error line). When the API
        cannot be reached (after the client's own retries) the waiting prompts fail for this run;
        the next run resumes the same batch by id."""
        try:
            return await self._poll(bid)
        except (asyncio.CancelledError, RetriesExhausted):
            raise
        except Exception as e:
            raise RetriesExhausted(TransportError(self.cfg.endpoints[0], f"polling batch {bid}: "
                                                  f"{type(e).__name__}: {e}"), 1) from None

    async def _poll(self, bid: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        delays = poll_delays(self.cfg.batch_poll_s, self.cfg.batch_poll_max_s)
        last = None
        while True:
            batch = (await self._api.batches.retrieve(bid)).model_dump()
            if batch["status"] != last:
                counts = batch.get("request_counts") or {}
                log.info("batch %s: %s (%s/%s done, %s failed)", bid, batch["status"], counts.get("completed"),
                         counts.get("total"), counts.get("failed"))
                last = batch["status"]
            if batch["status"] in TERMINAL:
                break
            await asyncio.sleep(next(delays))
        out = await self._file_text(batch.get("output_file_id"))
        err = await self._file_text(batch.get("error_file_id"))
        return batch, line_outcomes(out, err)

    async def _file_text(self, file_id: str | None) -> str:
        if not file_id:
            return ""
        return (await self._api.files.content(file_id)).text

    # ---- the rest of the Backend interface ---------------------------------------------------
    async def close(self) -> None:
        for w in self._watches.values():
            w.task.cancel()
        if self._flusher is not None:
            self._flusher.cancel()
        tasks = [w.task for w in self._watches.values()] + ([self._flusher] if self._flusher else [])
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._online is not None:
            await self._online.close()
        if self._api is not None:
            await self._api.close()

    async def served_info(self) -> dict[str, Any]:
        return {}

    def stats(self) -> dict[str, Any]:
        return {"n_requests": self.n_requests, "n_retries": 0, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "batched": self.n_batched,
                "failed_lines": self.n_failed_lines, "sent_online": self.n_online,
                "batches_created": list(self.batches_created), "batches_resumed": list(self.batches_resumed)}
