"""The tool registry (`rollout.tools`): user tools registered in params without editing the library (a Python
callable, an HTTP endpoint), code and search as two of its entries, and refusals that name the entry."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.config import ConfigError, config_from_dict, load_config
from pipeline.paths import REPO_ROOT
from pipeline.tools.code import CodeSandboxClient
from tests.helpers.tools import registry
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool, PythonTool
from tests.tools import user_functions

WORD = {"type": "object", "properties": {"word": {"type": "string"}, "n": {"type": "integer"}}, "required": ["word"]}


def python_entry(function: str, name: str = "lookup", **extra) -> dict:
    return {"kind": "python", "name": name, "function": f"tests.tools.user_functions:{function}",
            "description": "Look a word up.", "parameters": WORD, **extra}


def chat_config(*entries: dict, **rollout):
    return config_from_dict({"rollout": {"protocol": "chat-tools", "tools": list(entries), **rollout}})


def call(tool, **arguments):
    return asyncio.run(tool(json.dumps(arguments)))


def test_code_and_search_are_two_entries_of_the_registry() -> None:
    cfg = load_config(REPO_ROOT / "params.yaml")
    assert [t.kind for t in cfg.rollout.tools] == ["code", "search"]
    tools = registry(cfg, {"code": "http://127.0.0.1:1", "search": "http://127.0.0.1:2"})
    assert isinstance(tools["code"], CodeSandboxClient) and isinstance(tools["search"], SearchClient)
    assert registry(cfg, {}) == {}  # a service without a URL is not offered
    without_search = config_from_dict({"rollout": {"tools": [{"kind": "code"}]}})
    assert list(registry(without_search, {"code": "http://127.0.0.1:1", "search": "http://127.0.0.1:2"})) == ["code"]


def test_a_python_function_is_a_tool_by_its_import_path() -> None:
    cfg = chat_config({"kind": "code"}, python_entry("lookup"), python_entry("weigh", "weigh", parameters={
        "type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}}}))
    tools = registry(cfg, {})
    assert list(tools) == ["lookup", "weigh"]
    assert tools["lookup"].spec.parameters == WORD and tools["lookup"].spec.text_argument is None
    result = call(tools["lookup"], word="tapo", n=2)
    assert result.ok and result.output == "tapo: sense 1; sense 2"
    weighed = call(tools["weigh"], items=["a", "bcd"])  # async, and a value that is not a string: JSON
    assert weighed.ok and json.loads(weighed.output) == {"count": 2, "longest": "bcd"}


def test_a_python_tool_that_raises_is_an_observation_and_one_past_its_deadline_an_outage() -> None:
    broken = PythonTool(chat_config(python_entry("broken")).rollout.tools[0])
    result = call(broken, word="tapo")
    assert not result.ok and result.status == "error" and not result.infrastructure
    assert result.output == "KeyError: 'tapo'"
    slow = PythonTool(chat_config(python_entry("slow", "slow", timeout_s=0.2, parameters={
        "type": "object", "properties": {"seconds": {"type": "number"}}})).rollout.tools[0])
    timed_out = call(slow, seconds=1.0)
    assert timed_out.status == "timeout" and "did not finish in 0.2s" in timed_out.output
    assert timed_out.infrastructure  # the tool's failure, as every tool's past its deadline (docs/tools.md)
    assert slow.counts.calls == 1 and slow.counts.failed == 1


def test_a_python_tool_runs_at_most_concurrency_calls_at_once() -> None:
    tool = PythonTool(chat_config(python_entry("slow", "slow", concurrency=2, parameters={
        "type": "object", "properties": {"seconds": {"type": "number"}}})).rollout.tools[0])
    user_functions.IN_FLIGHT.update(now=0, most=0)

    async def five() -> list:
        return await asyncio.gather(*(tool(json.dumps({"seconds": 0.05})) for _ in range(5)))

    assert all(r.ok for r in asyncio.run(five()))
    assert user_functions.IN_FLIGHT["most"] == 2


@pytest.mark.parametrize(("entry", "error"), [
    (python_entry("missing"), "cannot load function 'tests.tools.user_functions:missing'"),
    (python_entry("NOT_CALLABLE"), "is not callable"),
])
def test_a_python_tool_that_cannot_load_is_refused_naming_it(entry: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        registry(chat_config(entry), {})


@pytest.mark.parametrize(("change", "error"), [
    ({"parameters": {"type": "string"}}, "must be a JSON schema with \"type\": \"object\""),
    ({"parameters": {"type": "object", "properties": {"n": {"type": "nonsense"}}}}, "not a valid JSON schema"),
    ({"name": "two words"}, "name"),
    ({"function": "no_colon"}, "function"),
])
def test_a_bad_user_tool_entry_is_refused_at_load_naming_its_key(change: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        chat_config(python_entry("lookup") | change)


def test_names_are_unique_across_the_registry() -> None:
    with pytest.raises(ConfigError, match="names \\['lookup'\\] more than once"):
        chat_config(python_entry("lookup"), python_entry("weigh"))


def test_user_tools_need_the_chat_tools_protocol() -> None:
    with pytest.raises(ConfigError, match="rollout.tools.*rollout.protocol"):
        config_from_dict({"rollout": {"protocol": "tapo", "tools": [python_entry("lookup")]}})


class _Endpoint(BaseHTTPRequestHandler):
    """/echo answers {"output": ...}; /error {"error": ...}; /text plain text; /down 503; /bad 400."""

    hits: dict[str, int] = {}

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Endpoint.hits[self.path] = _Endpoint.hits.get(self.path, 0) + 1
        status, payload, kind = {
            "/echo": (200, json.dumps({"output": f"{body['word']} means a test"}), "application/json"),
            "/error": (200, json.dumps({"error": f"no entry for {body['word']}"}), "application/json"),
            "/text": (200, f"plain {body['word']}", "text/plain"),
            "/down": (503, "overloaded", "text/plain"),
            "/bad": (400, "missing field", "text/plain"),
        }[self.path]
        data = payload.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(("path", "ok", "status", "infrastructure", "output"), [
    ("/echo", True, "ok", False, "tapo means a test"),
    ("/error", False, "error", False, "no entry for tapo"),
    ("/text", True, "ok", False, "plain tapo"),
    ("/bad", False, "rejected", False, "HTTP 400: missing field"),
    ("/down", False, "unavailable", True, "HTTP 503"),
])
def test_an_http_endpoint_is_a_tool(endpoint: str, path: str, ok: bool, status: str, infrastructure: bool,
                                    output: str) -> None:
    entry = {"kind": "http", "name": "define", "url": endpoint + path, "description": "Define a word.",
             "parameters": WORD, "retries": 1}
    tool = registry(chat_config(entry), {})["define"]
    assert isinstance(tool, HttpTool)
    result = call(tool, word="tapo")
    assert (result.ok, result.status, result.infrastructure) == (ok, status, infrastructure)
    assert output in result.output
    if path == "/down":
        assert _Endpoint.hits["/down"] == 2  # retried once


def test_an_unreachable_endpoint_is_an_outage() -> None:
    entry = {"kind": "http", "name": "define", "url": "http://127.0.0.1:9/x", "description": "Define a word.",
             "parameters": WORD, "retries": 0}
    result = call(registry(chat_config(entry), {})["define"], word="tapo")
    assert result.infrastructure and result.status == "unavailable"
