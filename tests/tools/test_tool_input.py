"""The policy's call input cannot make a client raise or report an outage: for every kind of tool (code, search,
a user's endpoint, a Python function, an MCP server), input that is not valid Unicode (a lone surrogate), not a
JSON object, holds NaN or an infinity, or nests too deeply, is refused as the policy's error (status "rejected",
never `infrastructure`) before any service or function sees it (`pipeline.tools.base.json_body`,
`parse_arguments`). Before, httpx raised on a lone surrogate (the search and HTTP clients raised, the code client
reported an outage: a failure the policy could cause on purpose), and a Python tool echoed it to the renderer."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config.tools import HttpToolEntry, McpToolEntry, PythonToolEntry
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.mcp import mcp_tools
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool, PythonTool
from tests.helpers.loopback import serving
from tests.tools import user_functions

SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
WITH_SURROGATE = st.builds(lambda a, s, b: a + s + b, st.text(max_size=20), SURROGATE, st.text(max_size=20))


def _deep(depth: int) -> str:
    return '{"text": ' + "[" * depth + "]" * depth + "}"


# Inputs of a JSON-argument tool that no tool may be called with.
BAD_ARGUMENTS = st.one_of(
    WITH_SURROGATE.map(lambda s: json.dumps({"text": s})),  # as the parsers read "\\ud83d" out of a call
    WITH_SURROGATE.map(lambda s: json.dumps({s: "x"})),
    WITH_SURROGATE.map(lambda s: json.dumps({"text": [{"deeper": s}]})),
    st.sampled_from(['{"text": NaN}', '{"text": -Infinity}', '[1, 2]', "null", '"text"', "", "{", _deep(100_000)]))


class _Counting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    requests = 0

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).requests += 1
        body = b'{"status": "ok", "stdout": "", "results": [], "output": ""}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def service() -> Iterator[type[_Counting]]:
    handler = type("Handler", (_Counting,), {"requests": 0, "release": threading.Event()})
    with serving(handler) as url:
        handler.url = url
        yield handler


@pytest.fixture(scope="module")
def echo_server() -> Iterator:
    tool, = mcp_tools(McpToolEntry(name="echo", command=(sys.executable, str(Path(__file__).with_name(
        "hostile_mcp.py")), "ok"), timeout_s=20.0, startup_timeout_s=30.0))
    yield tool
    asyncio.run(tool.aclose())


def _refused(result) -> bool:
    return (result.ok, result.status, result.infrastructure) == (False, "rejected", False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=WITH_SURROGATE)
def test_lone_surrogate_in_code_or_a_query_is_the_policys_error(service, text: str) -> None:
    async def go() -> list:
        clients = [CodeSandboxClient(service.url, retries=0), SearchClient(service.url, retries=0)]
        try:
            return [await client(text) for client in clients]
        finally:
            for client in clients:
                await client.aclose()

    before = service.requests
    assert all(_refused(r) and "lone surrogate" in r.output for r in asyncio.run(go()))
    assert service.requests == before  # no service saw it


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call_input=BAD_ARGUMENTS)
def test_bad_arguments_are_the_policys_error_for_every_user_tool(service, echo_server, call_input: str) -> None:
    endpoint = HttpTool(HttpToolEntry(name="define", description="Define.", url=f"{service.url}/x", retries=0,
                                      parameters={"type": "object"}))
    function = PythonTool(PythonToolEntry(name="lookup", description="Look up.", parameters={"type": "object"},
                                          function="tests.tools.user_functions:hang"))

    async def go() -> list:
        try:
            return [await tool(call_input) for tool in (endpoint, function, echo_server)]
        finally:
            await endpoint.aclose()

    before, called = service.requests, user_functions.CALLS["hang"]
    results = asyncio.run(go())
    assert all(_refused(r) for r in results), results
    assert service.requests == before and user_functions.CALLS["hang"] == called  # nothing was called
    assert echo_server.server.restarts == 0
