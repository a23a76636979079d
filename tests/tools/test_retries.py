"""Every HTTP client of a tool retries the same things the same way (`pipeline.tools.base.post_with_retries`),
checked as a matrix of client x what the service does, against a real loopback server that answers from a script:

* a dropped connection and an overloaded or restarting service (429/502/503/504, Retry-After honoured) are asked
  again, `retries` times at most, and a late success is the result;
* still failing after them is an outage (`infrastructure`), after exactly `retries + 1` requests;
* a service that does not answer in time is an outage after one request (asking again would wait again);
* a 4xx is the request's own doing: never retried, never an outage;
* a 500 is retried by search and user tools, not by the code sandbox (the snippet may have run)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from pipeline.config.tools import HttpToolEntry
from pipeline.tools.base import RETRY_AFTER_CAP_S, retry_delay
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool
from pipeline.types import ToolResult
from tests.helpers.loopback import serving

pytestmark = pytest.mark.integration  # real HTTP services that fail on purpose

RETRIES = 2
OK_BODY = {"code": {"status": "ok", "stdout": "42\n"}, "search": {"results": [{"title": "T", "text": "42"}]},
           "http": {"output": "42"}}


class _Script(BaseHTTPRequestHandler):
    """Answers the n-th POST with script[n] (the last one repeats): an HTTP status, "ok", "drop" (close without an
    answer) or "hang" (no answer until the test ends)."""

    protocol_version = "HTTP/1.1"
    script: list = []
    requests = 0
    ok_body = b"{}"
    release = threading.Event()
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            step = self.script[min(type(self).requests, len(self.script) - 1)]
            type(self).requests += 1
        if step == "hang":
            self.release.wait(30)
            return
        if step == "drop":
            self.close_connection = True
            return
        status, body = (200, self.ok_body) if step == "ok" else (step, json.dumps({"detail": "scripted"}).encode())
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 429:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def service() -> Iterator[type[_Script]]:
    handler = type("Handler", (_Script,), {"release": threading.Event(), "lock": threading.Lock(), "requests": 0})
    with serving(handler) as url:
        handler.url = url
        yield handler


def _client(kind: str, url: str, wait_s: float):
    """A client that waits `wait_s` for an answer (an endpoint's timeout_s is the whole call's deadline, so it must
    also hold the retries' back-off)."""
    if kind == "code":
        return CodeSandboxClient(url, timeout_s=wait_s / 2, retries=RETRIES), "print(42)"
    if kind == "search":
        return SearchClient(url, timeout_s=wait_s, retries=RETRIES), "the answer"
    entry = HttpToolEntry(name="lookup", description="Look up.", url=f"{url}/lookup", timeout_s=wait_s,
                          retries=RETRIES, parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    return HttpTool(entry), json.dumps({"q": "x"})


def _call(kind: str, service: type[_Script], script: list, wait_s: float = 5.0) -> ToolResult:
    service.script, service.ok_body = script, json.dumps(OK_BODY[kind]).encode()
    client, call_input = _client(kind, service.url, wait_s)

    async def once() -> ToolResult:
        try:
            return await client(call_input)
        finally:
            await client.aclose()

    return asyncio.run(once())


KINDS = ["code", "search", "http"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("failure", [503, 502, 504, 429, "drop"])
def test_a_passing_failure_is_asked_again_and_the_late_answer_counts(service, kind: str, failure) -> None:
    result = _call(kind, service, [failure] * RETRIES + ["ok"])  # the last retry succeeds
    assert result.ok and "42" in result.output, result
    assert service.requests == RETRIES + 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("failure", [503, 429, "drop"])
def test_a_lasting_failure_is_an_outage_after_exactly_the_retries(service, kind: str, failure) -> None:
    result = _call(kind, service, [failure])
    assert not result.ok and result.infrastructure and result.status == "unavailable", result
    assert service.requests == RETRIES + 1


@pytest.mark.parametrize("kind", KINDS)
def test_no_answer_in_time_is_an_outage_after_one_request(service, kind: str) -> None:
    result = _call(kind, service, ["hang"], wait_s=1.0)
    assert not result.ok and result.infrastructure, result
    assert service.requests == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [400, 413])
def test_a_request_the_service_refuses_is_never_retried_nor_an_outage(service, kind: str, status: int) -> None:
    result = _call(kind, service, [status, "ok"])
    assert not result.ok and not result.infrastructure, result
    assert service.requests == 1


@pytest.mark.parametrize(("kind", "retried"), [("code", False), ("search", True), ("http", True)])
def test_a_500_is_retried_except_by_the_code_sandbox(service, kind: str, retried: bool) -> None:
    result = _call(kind, service, [500, "ok"])
    assert result.ok == retried and service.requests == (2 if retried else 1), result
    if not retried:
        assert result.infrastructure


@pytest.mark.parametrize(("header", "expected"), [
    ("0", 0.0), ("1.5", 1.5), ("3600", RETRY_AFTER_CAP_S), ("inf", RETRY_AFTER_CAP_S),
    ("nan", 0.4), ("-5", 0.4), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.4), ("", 0.4)])
def test_retry_after_is_honoured_within_its_cap_and_nonsense_gets_the_back_off(header: str, expected: float) -> None:
    response = httpx.Response(503, headers={"Retry-After": header} if header else {})
    assert retry_delay(response, attempt=1) == pytest.approx(expected)
