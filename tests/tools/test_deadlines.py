"""Tool calls have total deadlines and bounded answers, for every HTTP client (code, search, a user's endpoint),
as a matrix of client x hostile service on a real loopback server:

* a service that drips its answer a byte at a time, or never answers, is cut at the call's deadline (not a
  per-read timeout, which a drip never trips) and is an outage (`infrastructure`): the service failed;
* an answer over `max_answer_bytes`, with or without a Content-Length, is not read past the limit (bounded
  memory) and is not an outage: "output_limit" for code (the snippet's print loop, the policy's), "too_large"
  for search and user endpoints (the size answers the arguments, which the policy chose);
* an answer in a content encoding we did not ask for (a gzip bomb would escape the limit) is garbage: an outage;
* cut calls do not leak connections: a client whose every connection was cut still answers;
* a tool that answers lone surrogates has them replaced (valid text for the renderer)."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from pipeline.config.tools import HttpToolEntry
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool
from pipeline.types import ToolResult
from tests.helpers.loopback import serving

pytestmark = pytest.mark.integration  # servers that drip and hang

# One body every client reads as a success: code reads status/stdout, search results, an endpoint output.
GOOD = json.dumps({"status": "ok", "stdout": "42", "results": [{"title": "T", "text": "42"}], "output": "42"}).encode()
HUGE = 128 << 20
LIMIT = 1 << 20


class _Hostile(BaseHTTPRequestHandler):
    """POST /<behaviour>: ok, drip (a byte each 0.2 s), hang, huge (128 MiB, chunked), huge-declared (a
    Content-Length of 128 MiB), gzip (the good body gzipped), surrogate (a lone surrogate in every text)."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()
    requests = 0
    sent = 0  # bytes of body written, over all requests

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).requests += 1
        behaviour = self.path.strip("/").split("/")[0]
        try:
            getattr(self, "_" + behaviour.replace("-", "_"))()
        except OSError:  # the client hung up: what a cut looks like from here
            pass

    def _head(self, length: int | None, **headers: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()

    def _write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
        type(self).sent += len(data)

    def _ok(self) -> None:
        self._head(len(GOOD))
        self._write(GOOD)

    def _drip(self) -> None:
        self._head(len(GOOD))
        for byte in GOOD:
            if self.release.wait(0.2):
                return
            self._write(bytes([byte]))

    def _hang(self) -> None:
        self.release.wait(60)

    def _huge(self) -> None:
        self._head(None)
        piece = b"x" * (1 << 20)
        for _ in range(HUGE // len(piece)):
            self._write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self._write(b"0\r\n\r\n")

    def _huge_declared(self) -> None:
        self._head(HUGE)
        self._write(b'{"output": "' + b"x" * 1000)
        self.release.wait(60)

    def _gzip(self) -> None:
        body = gzip.compress(GOOD)
        self._head(len(body), Content_Encoding="gzip")
        self._write(body)

    def _surrogate(self) -> None:
        body = GOOD.replace(b'"42"', b'"\\ud83d 42"').replace(b'"T"', b'"\\udc00T"')
        self._head(len(body))
        self._write(body)


@pytest.fixture()
def service() -> Iterator[type[_Hostile]]:
    handler = type("Handler", (_Hostile,), {"release": threading.Event(), "requests": 0, "sent": 0})
    with serving(handler) as url:
        handler.url = url
        yield handler


KINDS = ["code", "search", "http"]
DEADLINE_S = 1.5


def client(kind: str, url: str):
    """Each client with a per-read timeout far past the deadline: only the whole-call deadline can cut a drip."""
    if kind == "code":
        return CodeSandboxClient(url, timeout_s=0.5, deadline_s=DEADLINE_S, max_answer_bytes=LIMIT, retries=1)
    if kind == "search":
        return SearchClient(url, timeout_s=30.0, deadline_s=DEADLINE_S, max_answer_bytes=LIMIT, retries=1)
    return HttpTool(HttpToolEntry(name="lookup", description="Look up.", url=url, timeout_s=DEADLINE_S, retries=1,
                                  max_answer_bytes=LIMIT, parameters={"type": "object"}))


def call(kind: str, url: str, times: int = 1) -> list[ToolResult]:
    tool = client(kind, url)

    async def go() -> list[ToolResult]:
        try:
            return [await tool("{}" if kind == "http" else "print(42)") for _ in range(times)]
        finally:
            await tool.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", KINDS)
def test_dripping_service_is_cut_at_the_calls_deadline_as_an_outage(service, kind: str) -> None:
    result, = call(kind, f"{service.url}/drip")
    assert not result.ok and result.infrastructure and result.status == "unavailable", result
    assert f"deadline of {DEADLINE_S:g}s" in result.output
    assert service.sent < len(GOOD) and service.requests == 1  # cut mid-answer, never retried


@pytest.mark.parametrize("kind", KINDS)
def test_hanging_service_is_cut_at_the_calls_deadline_as_an_outage(service, kind: str) -> None:
    result, = call(kind, f"{service.url}/hang")
    assert result.infrastructure and f"deadline of {DEADLINE_S:g}s" in result.output, result
    assert service.requests == 1


@pytest.mark.parametrize(("kind", "status"), [("code", "output_limit"), ("search", "too_large"),
                                              ("http", "too_large")])
@pytest.mark.parametrize("behaviour", ["huge", "huge-declared"])
def test_huge_answer_is_not_read_past_the_limit_nor_an_outage(service, kind: str, status: str, behaviour: str) -> None:
    tracemalloc.start()
    try:
        result, = call(kind, f"{service.url}/{behaviour}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (result.ok, result.status, result.infrastructure) == (False, status, False), result
    assert f"over {LIMIT} bytes" in result.output and len(result.output) < 300
    assert service.requests == 1  # never retried
    assert peak < 8 * LIMIT, f"{peak / 2**20:.0f} MiB held for a {LIMIT >> 20} MiB limit"  # before: +513 MB RSS
    assert service.sent < HUGE // 4  # the client hung up early, not after reading it all


@pytest.mark.parametrize("kind", KINDS)
def test_answer_in_an_encoding_not_asked_for_is_an_outage(service, kind: str) -> None:
    result, = call(kind, f"{service.url}/gzip")
    assert result.infrastructure and "Content-Encoding 'gzip'" in result.output, result


@pytest.mark.parametrize("kind", KINDS)
def test_cut_calls_leave_the_client_usable(service, kind: str) -> None:
    """Every connection of the client was cut mid-answer (its pool holds as many as its concurrency): the next
    calls still get through."""
    tool = client(kind, service.url)

    async def go() -> list[ToolResult]:
        body = "{}" if kind == "http" else "print(42)"
        try:
            tool.url = f"{service.url}/drip"  # each client posts to its url (code and search add their route)
            await asyncio.gather(*(tool(body) for _ in range(10)))
            tool.url = f"{service.url}/ok"
            return await asyncio.gather(*(tool(body) for _ in range(3)))
        finally:
            await tool.aclose()

    results = asyncio.run(go())
    assert all(r.ok and "42" in r.output for r in results), results


@pytest.mark.parametrize("kind", KINDS)
def test_tool_answering_lone_surrogates_gives_valid_text(service, kind: str) -> None:
    result, = call(kind, f"{service.url}/surrogate")
    assert result.ok and "\ufffd" in result.output, result
    result.output.encode("utf-8")  # what the renderer's tokenizer needs


def test_retry_back_off_counts_against_the_deadline() -> None:
    """A service that keeps dropping connections is retried within the deadline, not past it."""
    tool = HttpTool(HttpToolEntry(name="lookup", description="Look up.", url="http://127.0.0.1:9/refused",
                                  timeout_s=0.5, retries=30, parameters={"type": "object"}))
    started = time.monotonic()
    result = asyncio.run(tool("{}"))
    asyncio.run(tool.aclose())
    assert result.infrastructure
    assert time.monotonic() - started < 20.0  # bounded by the 0.5 s deadline, not by 30 back-offs (~55 s)
