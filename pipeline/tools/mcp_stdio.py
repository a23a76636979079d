"""The stdio transport of an MCP server the run starts: the server as a child process, newline-delimited JSON-RPC
on its stdin and stdout, with the bounds `mcp.client.stdio` (the `mcp` package's own transport) lacks.

How it departs from `mcp.client.stdio`, and why:

1. Lines are split in linear time and held up to `max_line_bytes`. The package decodes its stdout as text and
   splits `buffer + chunk` again for each chunk, so one long line costs time quadratic in its length (a 40 MB
   result: 12 s of CPU) and memory without bound. Here each chunk is searched once for newlines; a longer line's
   bytes are dropped as they arrive, and the request it answers (its `id`, read from the line's start) is
   answered with the JSON-RPC error `ANSWER_TOO_LARGE`, so the call fails at once and the connection lives on.
2. A bad line ends the connection instead of being skipped or killing the reader: invalid UTF-8 (which made
   the package's reader raise and end the connection for the rest of the run), a line that is no JSON-RPC
   message (which it logged with a traceback, once per line: a flood of them starved the calls), an over-long
   line whose `id` cannot be read, and more than a burst of messages nobody asked for (`FloodGuard`). Whoever
   holds the connection (`pipeline.tools.mcp.McpServer`) is told why (`on_end`) and restarts the server: a
   server that breaks the framing once cannot be trusted to frame the next message.
3. Its stderr goes to the log up to `STDERR_BYTES`; the rest is read and counted, not written (a server that
   floods its stderr does not fill the disk, nor block on a full pipe).
4. The child gets a parent-death signal (SIGKILL when the thread that started it ends: the server's own
   thread, which lives as long as the connection is wanted), and its process group is killed when the
   connection ends however it ends, so no server outlives the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import anyio
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

ANSWER_TOO_LARGE = -32090  # the JSON-RPC error code (server-error range) an over-long answer is replaced with
STDERR_BYTES = 1 << 20  # a server's stderr kept in its log
_CHUNK = 1 << 16  # bytes read from a pipe at once
_ID_PREFIX = 1 << 16  # bytes of an over-long line kept to read its id from
_EXIT_GRACE_S = 2.0  # after its stdin closes, then after SIGTERM (as the MCP spec's shutdown sequence)
_SHOWN = 120  # bytes of a bad line quoted in the reason


@dataclass(frozen=True)
class Oversize:
    """A line longer than the limit: its first bytes (to read its id from) and its length."""

    prefix: bytes
    size: int


class LineSplitter:
    """Newline-delimited lines from a byte stream, in time linear in the bytes fed, holding at most `limit`
    bytes of a line (plus the chunk being read): a longer one comes out as an `Oversize`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes | Oversize]:
        lines: list[bytes | Oversize] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        self._add(chunk[start:])
        return lines

    def _add(self, piece: bytes) -> None:
        before, self._size = self._size, self._size + len(piece)
        if self._size <= self.limit:
            self._parts.append(piece)
        elif before <= self.limit:  # the line just went over: keep its start only, once
            self._parts = [b"".join(self._parts)[:_ID_PREFIX] + piece[:max(0, _ID_PREFIX - before)]]

    def _take(self) -> bytes | Oversize:
        line = b"".join(self._parts)
        taken = Oversize(line, self._size) if self._size > self.limit else line
        self._parts, self._size = [], 0
        return taken


class BadLine(Exception):
    """A line that breaks the framing; its message says how, quoting the line's start."""


def shown(line: bytes) -> str:
    return repr(line[:_SHOWN]) + ("..." if len(line) > _SHOWN else "")


# A string (one the prefix cut stays one token, to its end: never read as the bare words inside it), a bracket
# or separator, a bare value, or blanks.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[{}\[\]:,]|[^"{}\[\]:,\s]+|\s+')


def top_level_id(prefix: bytes) -> Any:
    """The `id` of the JSON object a line starts with, if its first bytes hold it (at depth 1), else None."""
    depth, key, after_colon = 0, None, False
    tokens = _TOKEN.findall(prefix.decode("utf-8", "replace"))
    for at, token in enumerate(tokens):
        if token[0] in "{[":
            depth += 1
        elif token[0] in "}]":
            depth -= 1
        elif token == ":":
            after_colon = True
            continue
        elif depth == 1 and after_colon and key == '"id"' and not token.isspace():
            if token[0] != '"' and at == len(tokens) - 1:
                return None  # a number the prefix may have cut ("1" of "10")
            with contextlib.suppress(ValueError):
                value = json.loads(token)
                return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None
            return None
        if not token.isspace():
            key, after_colon = (token if depth == 1 and token[0] == '"' else None), False
    return None


def message_of(line: bytes | Oversize, limit: int) -> SessionMessage | None:
    """The JSON-RPC message a line holds (None for a blank line); an over-long answer becomes its error;
    raises BadLine. Linear in the line's length."""
    if isinstance(line, Oversize):
        request_id = top_level_id(line.prefix)
        if request_id is None:
            raise BadLine(f"wrote a line of {line.size} bytes (over the limit of {limit}) whose id could not be "
                          f"read: {shown(line.prefix)}")
        error = types.ErrorData(code=ANSWER_TOO_LARGE, message=f"the answer was {line.size} bytes, over the limit "
                                f"of {limit} (max_answer_bytes); it was not read")
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadLine(f"wrote a line that is not UTF-8 ({err.reason} at byte {err.start}): {shown(line)}") from None
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except ValueError:
        pass
    try:  # JSON that pydantic's parser refuses only for lone surrogates (\ud83d): read as text with U+FFFD
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(_valid_strings(json.loads(text)),
                                                                            by_name=False))
    except (ValueError, RecursionError):
        raise BadLine(f"wrote a line that is not a JSON-RPC message: {shown(line)}") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_strings(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_valid_strings(v) for v in value]
    if isinstance(value, dict):
        return {_valid_strings(k): _valid_strings(v) for k, v in value.items()}
    return value


class FloodGuard:
    """Messages nobody asked for (notifications, requests from the server) allowed per connection: a burst of
    `burst`, refilled at `per_s` a second. Answers to our requests are never counted."""

    def __init__(self, burst: int = 1000, per_s: float = 100.0) -> None:
        self.burst, self.per_s = burst, per_s
        self._tokens, self._at = float(burst), time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def _die_with_parent() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # looked up before the fork

    def hook() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the thread that started it
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return hook


@contextlib.asynccontextmanager
async def bounded_stdio_client(command: Sequence[str], *, max_line_bytes: int, errlog: IO[str],
                               on_end: Callable[[str], None], on_spawn: Callable[[asyncio.subprocess.Process], None] = lambda process: None,
                               ) -> AsyncIterator[tuple[Any, Any]]:
    """Start `command` and yield the (read, write) streams of its JSON-RPC messages, as the `mcp` package's
    transports do. `on_end(reason)` is called once when the connection can no longer be used (the server closed
    its stdout or wrote a bad line); the server is stopped when the context is left, however it is left."""
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=get_default_environment(), start_new_session=True, preexec_fn=_die_with_parent())
    on_spawn(process)
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    broken: list[str] = []  # why the server broke the framing, if it did: it is then killed without a grace period

    def ended(reason: str, bad_line: bool) -> None:
        broken.extend([reason] if bad_line else [])
        on_end(reason)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_stdout, process, to_session, max_line_bytes, ended)
            tasks.start_soon(_write_stdin, process, from_session, ended)
            tasks.start_soon(_copy_stderr, process, errlog)
            try:
                yield read_stream, write_stream
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await stop_process(process, grace_s=0.0 if broken else _EXIT_GRACE_S)
            for stream in (read_stream, write_stream, to_session, from_session):
                await stream.aclose()


async def _read_stdout(process: asyncio.subprocess.Process, sink: Any, limit: int,
                       on_end: Callable[[str, bool], None]) -> None:
    lines, guard = LineSplitter(limit), FloodGuard()
    reason = "it closed its stdout (exited)"
    stdout = process.stdout
    assert stdout is not None  # the server is started with all three pipes
    try:
        async with sink:  # closing it ends the session: its pending requests fail at once
            while chunk := await stdout.read(_CHUNK):
                for line in lines.feed(chunk):
                    message = message_of(line, limit)
                    if message is None:
                        continue
                    answer = isinstance(message.message, (types.JSONRPCResponse, types.JSONRPCError))
                    if not answer and not guard.allow():
                        raise BadLine(f"sent more than {guard.burst} messages nobody asked for, faster than "
                                      f"{guard.per_s:g} a second")
                    await sink.send(message)
    except BadLine as err:
        on_end(str(err), True)
        return
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as err:
        reason = f"its connection broke ({type(err).__name__})"
    on_end(reason, False)  # not on cancellation: that is our own shutdown, with nobody to tell


async def _write_stdin(process: asyncio.subprocess.Process, source: Any, on_end: Callable[[str, bool], None]) -> None:
    stdin = process.stdin
    assert stdin is not None  # the server is started with all three pipes
    try:
        async with source:
            async for message in source:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
                stdin.write(data)
                await stdin.drain()
    except (OSError, anyio.ClosedResourceError, anyio.BrokenResourceError):
        on_end("its stdin was closed", False)


async def _copy_stderr(process: asyncio.subprocess.Process, errlog: IO[str]) -> None:
    written = dropped = 0
    stderr = process.stderr
    assert stderr is not None  # the server is started with all three pipes
    try:
        while chunk := await stderr.read(_CHUNK):
            kept = chunk[:max(0, STDERR_BYTES - written)]
            written, dropped = written + len(kept), dropped + len(chunk) - len(kept)
            if kept:
                errlog.write(kept.decode("utf-8", "replace"))
                errlog.flush()
    except (OSError, ValueError):  # the pipe, or the log closed under us at shutdown
        return
    finally:
        if dropped:
            with contextlib.suppress(OSError, ValueError):
                errlog.write(f"\n[{dropped} more bytes of stderr were not kept]\n")


async def stop_process(process: asyncio.subprocess.Process, grace_s: float = _EXIT_GRACE_S) -> None:
    """Close its stdin, give it `grace_s`, then SIGTERM (and `grace_s` again) and SIGKILL its process group (its
    children too). No grace for a server that broke the framing: it may be blocked writing a flood."""
    with contextlib.suppress(OSError, RuntimeError):
        if process.stdin is not None:
            process.stdin.close()
    if not await _exited(process, grace_s):
        kill_group(process.pid, signal.SIGTERM)
        await _exited(process, grace_s)
    kill_group(process.pid, signal.SIGKILL)  # also what the server left running in its group
    await _exited(process, _EXIT_GRACE_S)
    # asyncio keeps the subprocess transport open while a child of the server holds a pipe end, and warns when it
    # is collected after the loop closed; nothing public closes it (mcp.client.stdio does the same).
    transport = getattr(process, "_transport", None)
    with contextlib.suppress(OSError, RuntimeError):
        if transport is not None:
            transport.close()


def kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _exited(process: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Polls returncode: `process.wait()` also waits for the pipes' EOF, which a child of the server may hold."""
    deadline = time.monotonic() + timeout_s
    while process.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return process.returncode is not None
