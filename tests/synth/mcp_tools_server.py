"""A small MCP server for the tests of MCP tools in the tool-use generators, over stdio or
streamable HTTP (`python tests/synth/mcp_tools_server.py stdio | http PORT`). Its tools compute
real answers (so a test can tell a real call from a simulated one), fail, or hang."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("purokit-test-tools", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def word_count(text: str) -> dict:
    """Count the words of a text."""
    return {"words": len(text.split()), "text": text}


@server.tool()
def lookup_order(order_id: str) -> dict:
    """Look up an order by id; unknown ids are an error."""
    if order_id != "A-1":
        raise ValueError(f"no order {order_id}")
    return {"order_id": order_id, "status": "shipped"}


@server.tool()
async def slow_report(seconds: float) -> str:
    """A report that takes `seconds` to make."""
    await asyncio.sleep(seconds)
    return "done"


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
