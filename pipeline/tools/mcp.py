"""An MCP server as a tool source (`rollout.tools: [{kind: mcp, ...}]`), through the official `mcp` package.

At start-up the server is started (stdio: its command as a child process, its stderr in a log file) or reached
(streamable HTTP), and its tools' names, descriptions and input schemas are read: each becomes a tool of the
registry (`McpTool`), declared to the chat template by that schema. The connection lives on a thread of its own
with its own event loop, for the run: the MCP client's task groups must be entered and left by one task,
which the rollout engine's loop (run once per rollout) cannot give it. A call is handed to that loop and
awaited from the engine's.

Failure accounting is every client's (`pipeline.tools.base`): a result the server marks `isError` (the tool
refused the arguments or failed on them) is the policy's; a server that cannot be reached, has gone away,
or does not answer within `timeout_s` is an outage (`ToolResult.infrastructure`), counted per tool against the
run's outage limits. At most `concurrency` calls are in flight per server.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from concurrent.futures import Future
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from pipeline.config.tools import McpToolEntry
from pipeline.tools.base import CallCounts
from pipeline.types import ToolResult, ToolSpec


class McpUnavailable(RuntimeError):
    """An MCP server that could not be started or did not list its tools at start-up; names the server."""


class McpServer:
    """One MCP server's connection, on its own thread and event loop, for the life of the run."""

    def __init__(self, entry: McpToolEntry) -> None:
        self.entry = entry
        self.log = tempfile.NamedTemporaryFile("w", prefix=f"mcp-{entry.name}-", suffix=".log", delete=False)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"mcp-{entry.name}", daemon=True)
        self._thread.start()
        self._client: Client | None = None
        self._stop: asyncio.Event | None = None
        self._slots = asyncio.Semaphore(entry.concurrency)  # bound to the server's loop at first use
        self._closed = False
        self.specs = self._start()

    def _start(self) -> list[tuple[str, ToolSpec]]:
        """(its name on the server, its spec here) of each tool offered; raises McpUnavailable."""
        listed: Future[list[Any]] = Future()
        self._session = asyncio.run_coroutine_threadsafe(self._serve(listed), self.loop)
        try:
            tools = listed.result(timeout=self.entry.startup_timeout_s)
        except Exception as err:  # a timeout, or what the transport raised while connecting
            self.close()
            raise McpUnavailable(f"MCP server {self.entry.name!r}: could not start and list its tools in "
                                 f"{self.entry.startup_timeout_s}s: {type(err).__name__}: {err} (its stderr: "
                                 f"{self.log.name})") from err
        return self._chosen(tools)

    def _chosen(self, tools: list[Any]) -> list[tuple[str, ToolSpec]]:
        names = {t.name for t in tools}
        missing = sorted(set(self.entry.tools) - names)
        if missing:
            self.close()
            raise McpUnavailable(f"MCP server {self.entry.name!r} has no tool(s) {missing}; it lists {sorted(names)}")
        return [(t.name, ToolSpec(self.entry.prefix + t.name, t.description or t.name, dict(t.input_schema)))
                for t in tools if not self.entry.tools or t.name in self.entry.tools]

    async def _serve(self, listed: Future) -> None:
        """Connect, list the tools, then hold the connection until `close` (one task enters and leaves it)."""
        self._stop = asyncio.Event()
        try:
            async with Client(self._transport(), read_timeout_seconds=self.entry.timeout_s) as client:
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._client = client
                listed.set_result(tools)
                await self._stop.wait()
        except BaseException as err:  # noqa: BLE001 - the start-up waits on `listed`: it must hear of any failure
            if not listed.done():
                listed.set_exception(err)
            if not isinstance(err, Exception):
                raise
        finally:
            self._client = None

    def _transport(self) -> Any:
        if self.entry.url:
            return self.entry.url
        command, *args = self.entry.command
        return stdio_client(StdioServerParameters(command=command, args=args), errlog=self.log)

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The server's result of one call (on the server's loop); raises when the connection fails."""
        if self._client is None:
            raise ConnectionError(f"MCP server {self.entry.name!r} is not connected")
        async with self._slots:
            return await asyncio.wait_for(self._client.call_tool(tool, arguments), self.entry.timeout_s)

    def close(self) -> None:
        """Leave the connection (the stdio server exits) and stop the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        session = getattr(self, "_session", None)
        if session is not None:
            try:
                session.result(timeout=10.0)
            except Exception:  # noqa: BLE001 - closing: what the session died of was reported by its calls
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10.0)
        if not self._thread.is_alive():
            self.loop.close()
        self.log.close()


class McpTool:
    """One tool of an MCP server, as a registry tool: the arguments as a JSON object in, the result's text out."""

    def __init__(self, server: McpServer, remote_name: str, spec: ToolSpec) -> None:
        self.server, self.remote_name, self.spec, self.name = server, remote_name, spec, spec.name
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        pending = asyncio.run_coroutine_threadsafe(self.server.call(self.remote_name, json.loads(call_input)),
                                                   self.server.loop)
        try:  # the server's loop times the call out; this bound only guards against that loop being stuck
            result = await asyncio.wait_for(asyncio.wrap_future(pending), self.server.entry.timeout_s + 10.0)
        except TimeoutError:
            return self._outage(f"no answer in {self.server.entry.timeout_s}s", started)
        except Exception as err:  # the transport failed: the server went away, refused, or answered garbage
            return self._outage(f"{type(err).__name__}: {err}", started)
        text = _text_of(result)
        latency = time.perf_counter() - started
        if result.is_error:
            return self.counts.count(ToolResult.failure(text or "the tool failed", status="error", latency_s=latency))
        return self.counts.count(ToolResult(text, ok=True, latency_s=latency))

    def _outage(self, why: str, started: float) -> ToolResult:
        return self.counts.count(ToolResult.failure(
            f"MCP server {self.server.entry.name!r} unavailable: {why}", status="unavailable",
            latency_s=time.perf_counter() - started, infrastructure=True))

    async def aclose(self) -> None:
        await asyncio.to_thread(self.server.close)


def _text_of(result: Any) -> str:
    """The model's view of a call's result: its text blocks, else its structured content as JSON."""
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return ""


def mcp_tools(entry: McpToolEntry) -> list[McpTool]:
    """The tools of one MCP server, started (stdio) or reached (HTTP) and listed now."""
    server = McpServer(entry)
    return [McpTool(server, remote, spec) for remote, spec in server.specs]
