"""Real tools for the tool-use generators from a Model Context Protocol server (the `mcp` package):
`tools: {mcp: {command: [...]}}` (a server started as a subprocess, over stdio) or
`tools: {mcp: {url: http://host:port/mcp}}` (streamable HTTP).

The server's `tools/list` becomes the task's tools (OpenAI function definitions: name,
description, `inputSchema` as `parameters`), and the rollout calls them for real (`tools/call`)
instead of asking the Tool model to simulate an answer. The Tool Verifier judges each call
before it is sent, exactly as for simulated tools; the result becomes the `role: tool` message
(the structured result as JSON, else the text as a JSON object). A call past `timeout_s`, a
result with `isError`, or a protocol error raises `ToolCallFailed`: the conversation is rejected
with that reason.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from pydantic import model_validator

from purokit.config import StrictModel
from purokit.log import get_logger
from synth.domains.tool_sim import ToolCallFailed

log = get_logger("synth.domains.mcp_tools")


class McpServerConfig(StrictModel):
    command: list[str] | None = None        # argv of a stdio server, e.g. [python, -m, my_tools]
    url: str | None = None                  # a streamable HTTP endpoint, e.g. http://127.0.0.1:8931/mcp
    env: dict[str, str] | None = None       # extra environment of a stdio server
    timeout_s: float = 30.0                 # per tool call: past it the conversation is rejected
    connect_timeout_s: float = 60.0         # starting (stdio) or reaching (HTTP) the server and listing
    # calls in flight at once; default 1 over stdio (the SDK's stdio session answers one call at a
    # time, so a second call would spend its timeout waiting behind the first), 16 over HTTP
    max_concurrent_calls: int | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> "McpServerConfig":
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.command is not None and not self.command:
            raise ValueError("command is empty")
        return self

    @property
    def concurrent_calls(self) -> int:
        return self.max_concurrent_calls or (1 if self.command is not None else 16)

    def describe(self) -> str:
        return self.url if self.url is not None else " ".join(self.command or [])


class ToolsConfig(StrictModel):
    mcp: McpServerConfig


# ---- pure pieces ------------------------------------------------------------------------------

def openai_tool(name: str, description: str | None, input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """An MCP tool as an OpenAI function definition."""
    params = dict(input_schema or {"type": "object", "properties": {}})
    params.pop("title", None)               # pydantic's model title says nothing to the model
    # a description is required of every task tool (seeds.Toolset): the name stands in when the server gives none
    return {"type": "function", "function": {"name": name, "description": description or name, "parameters": params}}


def result_content(structured: Any, texts: list[str]) -> str:
    """A tool result as the content of a `role: tool` message: a JSON object (the structured
    result, or the text when it is one, else `{"result": text}`)."""
    if isinstance(structured, dict):
        return json.dumps(structured, ensure_ascii=False, sort_keys=True)
    text = "\n".join(texts)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    return json.dumps(parsed if isinstance(parsed, dict) else {"result": text}, ensure_ascii=False, sort_keys=True)


# ---- the connection ---------------------------------------------------------------------------

def _mcp() -> Any:
    try:
        import mcp
    except ImportError as e:
        raise RuntimeError(f"tools: {{mcp: ...}} needs the mcp package: pip install 'purokit[mcp]' ({e})") from None
    return mcp


class McpTools:
    """One MCP server for a run. An owner task holds the connection open (the client's task
    group must be entered and left by one task); calls come from any task of the run."""

    def __init__(self, cfg: McpServerConfig):
        self.cfg = cfg
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._lock: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self.n_calls = 0
        self.n_failed = 0

    def _target(self) -> Any:
        if self.cfg.url is not None:
            return self.cfg.url
        cmd = self.cfg.command or []
        return _mcp().StdioServerParameters(command=cmd[0], args=cmd[1:], env=self.cfg.env)

    async def _own(self) -> None:
        assert self._ready is not None and self._stop is not None
        try:
            async with _mcp().Client(self._target(), read_timeout_seconds=self.cfg.connect_timeout_s) as client:
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:           # noqa: BLE001 - reported to every caller
            self._error = e
        finally:
            self._client = None
            self._ready.set()

    async def start(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._owner is not None:
                return
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._owner = asyncio.create_task(self._own())
            try:
                async with asyncio.timeout(self.cfg.connect_timeout_s):
                    await self._ready.wait()
            except TimeoutError:
                self._error = TimeoutError(f"no connection within connect_timeout_s={self.cfg.connect_timeout_s:g}")
        if self._client is None:
            raise RuntimeError(f"MCP server {self.cfg.describe()}: cannot connect: "
                               f"{type(self._error).__name__}: {self._error}")

    async def list(self) -> list[dict[str, Any]]:
        await self.start()
        listing = await self._client.list_tools()
        return [openai_tool(t.name, t.description, t.input_schema) for t in listing.tools]

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The tool's result as tool-message content, or `ToolCallFailed` with the reason."""
        await self.start()
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.cfg.concurrent_calls)
        self.n_calls += 1
        try:
            async with self._slots, asyncio.timeout(self.cfg.timeout_s):    # the timeout is the tool's own time
                r = await self._client.call_tool(name, arguments, read_timeout_seconds=self.cfg.timeout_s)
        except TimeoutError:
            self.n_failed += 1
            raise ToolCallFailed(f"tool {name} timed out after {self.cfg.timeout_s:g} s "
                                 f"(MCP {self.cfg.describe()})") from None
        except Exception as e:               # the protocol's errors (McpError, transport)
            self.n_failed += 1
            raise ToolCallFailed(f"tool {name} failed: {type(e).__name__}: {e}") from None
        texts = [getattr(c, "text", "") for c in r.content or [] if getattr(c, "type", "") == "text"]
        if r.is_error:
            self.n_failed += 1
            raise ToolCallFailed(f"tool {name} returned an error: {' '.join(texts)[:300]}")
        return result_content(r.structured_content, texts)

    async def aclose(self) -> None:
        if self._owner is not None and self._stop is not None:
            self._stop.set()
            await asyncio.gather(self._owner, return_exceptions=True)
            self._owner = None


def list_tools_now(cfg: McpServerConfig) -> list[dict[str, Any]]:
    """The server's tools, from synchronous code (a source runs while the run's event loop is
    busy): a short-lived connection on a thread of its own."""
    out: dict[str, Any] = {}

    async def listing() -> None:
        tools = McpTools(cfg)
        try:
            out["tools"] = await tools.list()
        finally:
            await tools.aclose()

    def run() -> None:
        try:
            asyncio.run(listing())
        except BaseException as e:           # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=run, name="mcp-list-tools")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    log.info("MCP server %s: %d tools (%s)", cfg.describe(), len(out["tools"]),
             ", ".join(t["function"]["name"] for t in out["tools"]))
    return out["tools"]
