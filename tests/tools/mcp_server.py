"""A real MCP server for the registry tests (the official `mcp` package): `python -m tests.tools.mcp_server`
serves over stdio; with `http PORT`, over streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("registry-test")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


@app.tool()
async def nap(seconds: float) -> str:
    """Sleep, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


BUSY = {"now": 0, "most": 0}


@app.tool()
async def busy(seconds: float) -> int:
    """Sleep; answer the most calls this server has had in flight at once."""
    BUSY["now"] += 1
    BUSY["most"] = max(BUSY["most"], BUSY["now"])
    await asyncio.sleep(seconds)
    BUSY["now"] -= 1
    return BUSY["most"]


@app.tool()
def big(size: int) -> str:
    """A text of `size` bytes."""
    return "x" * size


@app.tool()
def refuse(reason: str) -> str:
    """Fail with the reason."""
    raise ValueError(reason)


@app.tool()
def die() -> str:
    """End the server process (an outage)."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
