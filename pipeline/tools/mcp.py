"""An MCP server as a tool source (`rollout.tools: [{kind: mcp, ...}]`), through the official `mcp` package.

At start-up the server is started (stdio: its command as a child process, its stderr in a log file) or reached
(streamable HTTP), and its tools' names, descriptions and input schemas are read: each becomes a tool of the
registry (`McpTool`), declared to the chat template by that schema. The connection lives on a thread of its own
with its own event loop, for the run: the MCP client's task groups must be entered and left by one task,
which the rollout engine's loop (run once per rollout) cannot give it. A call is handed to that loop and
awaited from the engine's.

The server is supervised (docs/tools.md, "MCP supervision"), where the `mcp` package's client is not: one start
(spawning it, `initialize`, listing its tools) has `startup_timeout_s`; a server that misses it, exits, or breaks
the stdio framing (a line that is not UTF-8 or not JSON-RPC, an over-long line without a readable id, a flood of
messages nobody asked for: `pipeline.tools.mcp_stdio`, our own stdio transport, which also reads lines in linear
time up to `max_answer_bytes`) is stopped, process group and all, and started again after a back-off, logged, at
most `restarts` times in a row (a call answered in between resets the count); then it is given up and its calls
are outages. Before, one exit or one bad line ended the connection for the rest of the run, and a server that
never answered `initialize` outlived the trainer.

Failure accounting is every client's (`pipeline.tools.base`): a result the server marks `isError` (the tool
refused the arguments or failed on them), and an `invalid params` error, are the policy's; a result over
`max_answer_bytes` is cut unread (status "too_large", not an outage); a server that cannot be reached, has gone
away, is being restarted or was given up, or does not answer within `timeout_s` (the deadline of the whole call)
is an outage (`ToolResult.infrastructure`), counted per tool against the run's outage limits. At most
`concurrency` calls are in flight per server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError

from pipeline.config.tools import McpToolEntry
from pipeline.tools.base import CallCounts, parse_arguments
from pipeline.tools.mcp_http import answer_too_large, bounded_http_client, connection_gone
from pipeline.tools.mcp_stdio import ANSWER_TOO_LARGE, bounded_stdio_client, kill_group
from pipeline.types import ToolResult, ToolSpec

log = logging.getLogger(__name__)
_MAX_LIST_PAGES = 100  # a tool list that pages on for ever cannot hold the start-up
_BACKOFF_CAP_S = 8.0
_CLOSE_S = 15.0  # leaving a connection: the transport's shutdown takes at most ~6 s (grace, SIGTERM, SIGKILL)


class McpUnavailable(RuntimeError):
    """An MCP server that could not be started or did not list its tools at start-up; names the server."""


class McpGivenUp(ConnectionError):
    """The server failed `restarts` times in a row and is not started again."""


def restart_delay(failures: int) -> float:
    """Back-off before the next start after `failures` failures in a row: 0.5 s, doubling, at most 8 s."""
    return min(0.5 * 2 ** (failures - 1), _BACKOFF_CAP_S)


class McpServer:
    """One MCP server's connection, on its own thread and event loop, supervised for the life of the run."""

    def __init__(self, entry: McpToolEntry) -> None:
        self.entry = entry
        self.log = tempfile.NamedTemporaryFile("w", prefix=f"mcp-{entry.name}-", suffix=".log", delete=False)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"mcp-{entry.name}", daemon=True)
        self._thread.start()
        self._client: Client | None = None
        self._wake = asyncio.Event()  # the connection ended, or close() was called (used on the server's loop)
        self._changed = asyncio.Event()  # connected, given up or stopping: what a waiting call wakes for
        self._stopping = False
        self._scope: anyio.CancelScope | None = None  # the current connection's
        self._lost_reason = ""
        self.given_up = ""  # why the server was given up ("" while it is not)
        self.failures = 0  # in a row, since the last call answered
        self.restarts = 0  # over the run
        self.processes: list[asyncio.subprocess.Process] = []  # every child started (stdio), to make sure of them
        self._slots = asyncio.Semaphore(entry.concurrency)  # bound to the server's loop at first use
        self._closed = False
        self.specs = self._start()

    def _start(self) -> list[tuple[str, ToolSpec]]:
        """(its name on the server, its spec here) of each tool offered; raises McpUnavailable."""
        listed: Future[list[Any]] = Future()
        self._session = asyncio.run_coroutine_threadsafe(self._supervise(listed), self.loop)
        attempts = self.entry.restarts + 1  # each start is bounded on the loop; this only guards a stuck loop
        bound = attempts * (self.entry.startup_timeout_s + _BACKOFF_CAP_S + _CLOSE_S) + 10.0
        try:
            tools = listed.result(timeout=bound)
        except Exception as err:  # every start failed, or the loop is stuck
            self.close()
            raise McpUnavailable(f"MCP server {self.entry.name!r}: could not start and list its tools in {attempts} "
                                 f"attempt(s) of {self.entry.startup_timeout_s:g}s: {err} (its stderr: "
                                 f"{self.log.name})") from err
        return self._chosen(tools)

    def _chosen(self, tools: list[Any]) -> list[tuple[str, ToolSpec]]:
        names = {t.name for t in tools}
        missing = sorted(set(self.entry.tools) - names)
        if missing:
            self.close()
            raise McpUnavailable(f"MCP server {self.entry.name!r} has no tool(s) {missing}; it lists {sorted(names)}")
        return [(t.name, ToolSpec(self.entry.prefix + t.name, t.description or t.name, dict(t.input_schema),
                                  origin=f"MCP server {self.entry.name!r}"))
                for t in tools if not self.entry.tools or t.name in self.entry.tools]

    async def _supervise(self, listed: Future) -> None:
        """Connect, and connect again when the connection ends, until `close` or `restarts` failures in a row."""
        while not self._stopping:
            reason = await self._connection(listed)
            if self._stopping:
                return
            self.failures += 1
            if self.failures > self.entry.restarts:
                self.given_up = reason
                log.error("MCP server %r %s; given up after %d restart(s) in a row (its stderr: %s)",
                          self.entry.name, reason, self.entry.restarts, self.log.name)
                if not listed.done():
                    listed.set_exception(McpUnavailable(reason))
                self._changed.set()
                return
            delay = restart_delay(self.failures)
            self.restarts += 1
            log.warning("MCP server %r %s; starting it again in %gs (%d of %d in a row)", self.entry.name, reason,
                        delay, self.failures, self.entry.restarts)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)  # close() cuts the back-off short

    async def _connection(self, listed: Future) -> str:
        """One connection: start, initialize and list the tools within `startup_timeout_s`, then serve calls
        until it ends; returns why it ended. Leaving it stops the server (the transport's doing)."""
        self._wake.clear()
        self._lost_reason = ""
        started = anyio.current_time()
        try:
            with anyio.CancelScope(deadline=started + self.entry.startup_timeout_s) as start_up:
                self._scope = start_up  # close() cancels it: a start in progress is not waited out
                async with Client(self._transport(), read_timeout_seconds=self.entry.timeout_s) as client:
                    tools = await _all_tools(client)
                    start_up.deadline = math.inf  # started: the connection is held until it ends
                    self._connected(client, tools, listed)
                    await self._wake.wait()
                    return self._lost_reason or "stopped"
        except Exception as err:  # noqa: BLE001 - whatever the start or the connection died of is the reason
            return self._lost_reason or f"failed: {_leaf(err)}"
        finally:
            self._client, self._scope = None, None
        return (f"did not start, answer `initialize` and list its tools within {self.entry.startup_timeout_s:g}s"
                if start_up.cancelled_caught else self._lost_reason or "its connection ended")

    def _connected(self, client: Client, tools: list[Any], listed: Future) -> None:
        self._client = client
        if not listed.done():
            listed.set_result(tools)
        else:
            log.warning("MCP server %r started again (%d restart(s) so far)", self.entry.name, self.restarts)
            missing = sorted(set(name for name, _ in self.specs) - {t.name for t in tools})
            if missing:
                log.error("MCP server %r no longer lists %s: their calls will fail", self.entry.name, missing)
        self._changed.set()

    def _transport(self) -> Any:
        if self.entry.url:
            return bounded_http_client(self.entry.url, self.entry.max_answer_bytes)
        return bounded_stdio_client(self.entry.command, max_line_bytes=self.entry.max_answer_bytes,
                                    errlog=self.log, on_end=self._lost, on_spawn=self.processes.append)

    def _lost(self, reason: str) -> None:
        """The connection can no longer be used (on the server's loop): calls wait for the supervisor to start
        the server again."""
        self._client = None
        self._lost_reason = self._lost_reason or reason
        self._wake.set()

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The server's result of one call (on the server's loop), within the call's deadline (`timeout_s`, waiting
        for a restarting server included); raises when there is none."""
        return await asyncio.wait_for(self._call(tool, arguments), self.entry.timeout_s)

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        async with self._slots:
            while self._client is None:
                if self.given_up or self._stopping:
                    raise McpGivenUp(f"it was given up: {self.given_up}" if self.given_up else "it was closed")
                self._changed.clear()
                await self._changed.wait()
            try:
                result = await self._client.call_tool(tool, arguments)
            except MCPError as err:
                if connection_gone(err):
                    self._lost(f"closed the connection: {err.message}")
                else:
                    self.failures = 0  # it answered: alive
                raise
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as err:
                self._lost(f"lost the connection: {type(err).__name__}: {err}")
                raise
            self.failures = 0
            return result

    def close(self) -> None:
        """Leave the connection (the stdio server is stopped) and stop the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self._stop)
        session = getattr(self, "_session", None)
        if session is not None:
            try:
                session.result(timeout=_CLOSE_S)
            except FutureTimeout:  # a start or a shutdown stuck past its bounds: cancel it, then kill below
                session.cancel()
            except Exception:  # noqa: BLE001 - closing: what the session died of was reported by its calls
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10.0)
        if not self._thread.is_alive():
            self.loop.close()
        for process in self.processes:  # the last word: no server outlives its connection
            if process.returncode is None:
                kill_group(process.pid, signal.SIGKILL)
        self.log.close()

    def _stop(self) -> None:
        self._stopping = True
        if self._scope is not None:
            self._scope.cancel()
        self._wake.set()
        self._changed.set()


def _leaf(err: BaseException) -> str:
    """What an error (the first one, inside the task groups' exception groups) says."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}"


async def _all_tools(client: Client) -> list[Any]:
    tools, cursor = [], None
    for _ in range(_MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools
    raise ValueError(f"its tool list goes on past {_MAX_LIST_PAGES} pages")


class McpTool:
    """One tool of an MCP server, as a registry tool: the arguments as a JSON object in, the result's text out."""

    def __init__(self, server: McpServer, remote_name: str, spec: ToolSpec) -> None:
        self.server, self.remote_name, self.spec, self.name = server, remote_name, spec, spec.name
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        arguments = parse_arguments(call_input)
        if isinstance(arguments, ToolResult):
            return self.counts.count(arguments)
        try:  # the server's loop times the call out; this bound only guards against that loop being stuck
            pending = asyncio.run_coroutine_threadsafe(self.server.call(self.remote_name, arguments.values),
                                                       self.server.loop)
            result = await asyncio.wait_for(asyncio.wrap_future(pending), self.server.entry.timeout_s + 10.0)
        except Exception as err:  # noqa: BLE001 - every way a call fails is classified, none raised
            return self.counts.count(replace_latency(self._failure(err), started))
        text = _text_of(result)
        if result.is_error:
            return self.counts.count(replace_latency(ToolResult.failure(text or "the tool failed", status="error"),
                                                     started))
        return self.counts.count(replace_latency(ToolResult(text, ok=True), started))

    def _failure(self, err: Exception) -> ToolResult:
        name = self.server.entry.name
        if isinstance(err, MCPError) and (err.code == ANSWER_TOO_LARGE or answer_too_large(err)):
            return ToolResult.failure(f"MCP server {name!r}: {err.message}", status="too_large")
        if isinstance(err, MCPError) and err.code == mcp_types.INVALID_PARAMS:
            return ToolResult.failure(f"MCP server {name!r} refused the arguments: {err.message}", status="rejected")
        why = f"no answer in {self.server.entry.timeout_s}s" if isinstance(err, TimeoutError) else \
            f"{type(err).__name__}: {err}"
        return ToolResult.failure(f"MCP server {name!r} unavailable: {why}", status="unavailable", infrastructure=True)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.server.close)


def replace_latency(result: ToolResult, started: float) -> ToolResult:
    return ToolResult(result.output, result.ok, result.status, result.error, time.perf_counter() - started,
                      result.infrastructure)


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
