"""Every input the server parses is bounded before any work is done: body size however it
is sent, the time a request head or body may take, numbers that are not finite, and the
count, spelling and bytes of `files` / `fetch_files`. Plus a fuzz of the JSON bodies."""

from __future__ import annotations

import base64
import json
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.services.processes import ServiceProcess, free_port, python_service
from sandbox.code.files import MAX_FETCH_FILES, MAX_FETCH_TOTAL_BYTES, MAX_FILES
from tests.sandbox.support import UID_BASE, Sandbox, wait_until


def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b"}" in data:
                break
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_a_chunked_body_over_the_limit_is_413_without_being_read(sandbox: Sandbox) -> None:
    sock = _raw(sandbox.port)
    sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    sent = 0
    try:
        for _ in range(64 * 16):  # offers 64 MiB; the server must stop reading at 1 MiB
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _read_response(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 64 << 20 or b"413" in answer


def test_a_declared_body_over_the_limit_is_413(sandbox: Sandbox) -> None:
    sock = _raw(sandbox.port)
    sock.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{")
    assert _read_response(sock).startswith(b"HTTP/1.1 413")
    sock.close()


@pytest.mark.parametrize("path, body", [
    ("/run", b'{"code": "print(1)", "timeout_s": NaN}'),
    ("/run", b'{"code": "print(1)", "timeout_s": Infinity}'),
    ("/run", b'{"code": "print(1)", "timeout_s": -Infinity}'),
    ("/run", b'{"code": "print(1)", "timeout_s": 1e999}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "run_timeout": NaN}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "compile_timeout": NaN}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "run_timeout": Infinity}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "compile_timeout": 1e999}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "memory_limit_MB": NaN}'),
    ("/run_code", b'{"language": "python", "code": "print(1)", "stdin": "\\ud800"}'),
    ("/run_code", b'{"language": "python", "code": "\\udfff"}'),
    ("/run_code", b'not json'),
    ("/run_code", b'[1, 2]'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"a": "not base64!"}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"/abs": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"../up": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"a\\u0000b": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"a": "", "./a": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"a/../b": "", "b": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"' + b"d/" * 20 + b'f": ""}}'),
    ("/run_code", b'{"language": "python", "code": "x", "files": {"' + b"n" * 300 + b'": ""}}'),
], ids=lambda v: v if isinstance(v, str) else v[:60].decode(errors="replace"))
def test_non_finite_numbers_and_bad_inputs_are_422_not_500(sandbox: Sandbox, path: str, body: bytes) -> None:
    response = httpx.post(f"{sandbox.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422, response.text
    assert isinstance(response.json()["detail"], list)


def _run_code(sandbox: Sandbox, **body) -> httpx.Response:
    return httpx.post(f"{sandbox.url}/run_code", json={"language": "python", **body}, timeout=60)


def test_too_many_files_or_fetches_are_refused_before_running(sandbox: Sandbox) -> None:
    files = {f"f{i}": "" for i in range(MAX_FILES + 1)}
    assert _run_code(sandbox, code="print(1)", files=files).status_code == 422
    fetch = [f"f{i}" for i in range(MAX_FETCH_FILES + 1)]
    assert _run_code(sandbox, code="print(1)", fetch_files=fetch).status_code == 422
    big = base64.b64encode(b"x" * 600_000).decode()
    assert _run_code(sandbox, code="print(1)", files={"a": big}).status_code in (200, 413)  # 1 MiB body bound


def test_every_spelling_of_one_file_is_fetched_once(sandbox: Sandbox) -> None:
    code = "open('big', 'wb').write(b'z' * (1 << 20))"
    spellings = ["big", "./big", "0/../big", "1/../big", "big/.", ".//big", "a/b/../../big"] + [f"{i}/../big" for i in range(40)]
    response = _run_code(sandbox, code=code, fetch_files=spellings)
    assert response.status_code == 200, response.text
    assert list(response.json()["files"]) == ["big"]
    assert len(response.content) < 2 << 20


def test_fetched_bytes_are_bounded_in_total(sandbox: Sandbox) -> None:
    code = "for i in range(8):\n    open(f'f{i}', 'wb').write(b'q' * (1 << 20))"
    response = _run_code(sandbox, code=code, fetch_files=[f"f{i}" for i in range(8)])
    files = response.json()["files"]
    assert sum(len(base64.b64decode(v)) for v in files.values()) <= MAX_FETCH_TOTAL_BYTES
    assert 0 < len(files) < 8


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                    max_leaves=12),
       st.sampled_from(["code", "language", "timeout_s", "memory_mb", "run_timeout", "compile_timeout",
                        "memory_limit_MB", "stdin", "files", "fetch_files"]),
       st.sampled_from(["/run", "/run_code"]))
def test_fuzzed_bodies_get_an_answer_never_a_server_error(sandbox: Sandbox, value, key: str, path: str) -> None:
    body = {"code": "print(1)", "language": "python", "timeout_s": 2, "run_timeout": 2, key: value}
    raw = json.dumps(body, allow_nan=True).encode()
    response = httpx.post(f"{sandbox.url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code in (200, 413, 422), (response.status_code, response.text[:500])
    response.json()


# Any bytes, on any route and method: undecodable text, lone surrogates written as escapes, wrong
# types, nesting past any parser's depth, huge numbers. The search service's twin of this is in
# tests/search/test_bad_input.py: both services answer bad input with a 4xx, never a 5xx.
_SURROGATES = st.text(st.characters(categories=["Cs", "Ll", "Nd"]), min_size=1, max_size=8)


@st.composite
def _raw_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "surrogate", "nested", "number"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "nested":
        depth = draw(st.integers(1, 50_000))
        return b'{"code": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    if kind == "number":
        return b'{"code": "print(1)", "language": "python", "run_timeout": 1' + b"0" * draw(st.integers(1, 100_000)) + b"}"
    key = draw(st.sampled_from(["code", "stdin", "language", "files", "fetch_files"]))
    value = draw(_SURROGATES)
    value = {value: value} if key == "files" else [value] if key == "fetch_files" else value
    return json.dumps({"code": "print(1)", "language": "python", key: value}).encode()


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(_raw_bodies(), st.sampled_from(["/run", "/run_code", "/health", "/nowhere"]), st.sampled_from(["POST", "GET"]))
def test_any_bytes_on_any_route_get_an_answer_never_a_server_error(sandbox: Sandbox, body: bytes, path: str,
                                                                     method: str) -> None:
    response = httpx.request(method, f"{sandbox.url}{path}", content=body, headers={"content-type": "application/json"},
                             timeout=60)
    assert response.status_code in (200, 404, 405, 413, 422), (response.status_code, response.text[:300])
    response.json()


def test_refused_bodies_leave_the_server_small(sandbox: Sandbox) -> None:
    """What the server holds for a refused body is bounded by the body limit, not by what is offered."""
    server = psutil.Process(sandbox.service.process.pid)
    before = server.memory_info().rss
    for body in (b"[" * 500_000 + b"]" * 500_000, b'{"code": "' + b"\\udfff" * 150_000 + b'"}', b"\xff" * (1 << 20)):
        for _ in range(5):
            assert httpx.post(f"{sandbox.url}/run", content=body, timeout=60).status_code == 422
    test_a_chunked_body_over_the_limit_is_413_without_being_read(sandbox)
    assert server.memory_info().rss - before < 32 << 20


@pytest.fixture(scope="module")
def impatient_sandbox(tmp_path_factory: pytest.TempPathFactory):
    args = ["--workers", "1", "--header-timeout-s", "1", "--body-timeout-s", "1", "--uid-base", str(UID_BASE + 224)]
    logs: Path = tmp_path_factory.mktemp("impatient-sandbox")
    with python_service("impatient-sandbox", "sandbox.code", args, free_port(), logs) as service:
        yield service


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def test_half_sent_request_heads_are_dropped(impatient_sandbox: ServiceProcess) -> None:
    """Slowloris: connections that never finish their request head do not stay open."""
    sockets = [_raw(impatient_sandbox.port) for _ in range(200)]
    for i, sock in enumerate(sockets):
        sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"POST /ru")
    idle = _raw(impatient_sandbox.port)  # sends nothing at all
    assert all(_closed_by_server(sock) for sock in [*sockets, idle])
    for sock in [*sockets, idle]:
        sock.close()
    answer = httpx.post(f"{impatient_sandbox.url}/run", json={"code": "print(3)"}, timeout=60).json()
    assert answer["stdout"] == "3\n"


def test_a_trickled_head_is_dropped_even_if_bytes_keep_coming(impatient_sandbox: ServiceProcess) -> None:
    sock = _raw(impatient_sandbox.port)
    sock.sendall(b"POST /run HTTP/1.1\r\n")
    closed = False
    for _ in range(600):  # one header line every 0.1 s: each byte is "progress", the head never ends
        try:
            sock.sendall(b"X-A: b\r\n")
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        time.sleep(0.1)
    sock.close()
    assert closed


def test_an_oversized_head_is_dropped(impatient_sandbox: ServiceProcess) -> None:
    sock = _raw(impatient_sandbox.port)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\n" + b"X-Pad: " + b"p" * (200 * 1024))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert _closed_by_server(sock)
    sock.close()


def test_a_slow_body_is_408(impatient_sandbox: ServiceProcess) -> None:
    sock = _raw(impatient_sandbox.port)
    sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"co")
    assert _read_response(sock).startswith(b"HTTP/1.1 408")
    sock.close()


def test_keep_alive_requests_still_work_under_the_head_deadline(impatient_sandbox: ServiceProcess) -> None:
    with httpx.Client(base_url=impatient_sandbox.url, timeout=60) as client:
        for i in range(5):
            assert client.post("/run", json={"code": f"print({i})"}).json()["stdout"] == f"{i}\n"
    assert wait_until(lambda: httpx.get(f"{impatient_sandbox.url}/health").status_code == 200)


async def test_bodies_in_flight_are_bounded_together() -> None:
    """Many slow uploads cannot add up: past the shared budget a new body is 503, not buffered."""
    import asyncio

    from sandbox.http_limits import BodyLimits

    seen: list[bytes] = []

    async def app(scope, receive, send) -> None:
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    limits = BodyLimits(app, limit=1000, timeout_s=30, max_buffered=1500)
    release = asyncio.Event()

    def slow_client(parts: list[bytes]):
        async def receive():
            if len(parts) == 1:
                await release.wait()
            part = parts.pop(0)
            return {"type": "http.request", "body": part, "more_body": bool(parts)}
        return receive

    statuses: list[int] = []

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    scope = {"type": "http", "headers": []}
    first = asyncio.create_task(limits(scope, slow_client([b"a" * 900, b"b" * 10]), send))
    await asyncio.sleep(0)
    await limits(scope, slow_client([b"c" * 900, b"d"]), send)  # would pass 1500 together with the first
    release.set()
    await first
    assert statuses == [503, 200], statuses
    assert seen == [b"a" * 900 + b"b" * 10]
    assert limits.buffered == 0


def _request(body: bytes, path: str = "/run", extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
            + extra + b"\r\n" + body)


def test_pipelined_requests_are_all_answered_in_order(impatient_sandbox: ServiceProcess) -> None:
    sock = _raw(impatient_sandbox.port)
    sock.sendall(b"".join(_request(json.dumps({"code": f"print({i})"}).encode()) for i in range(3)))
    data = b""
    while data.count(b"HTTP/1.1 200") < 3 or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    sock.close()
    bodies = [json.loads(part[part.index(b"{"):part.rindex(b"}") + 1]) for part in data.split(b"HTTP/1.1 ")[1:]]
    assert [b["stdout"] for b in bodies] == ["0\n", "1\n", "2\n"], data[:500]


@pytest.mark.parametrize("raw, status", [
    (b"GET /run HTTP/1.1\r\nHost: x\r\n\r\n", b"405"),
    (b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", b"404"),
    (b"POST /run HTTP/1.0\r\nContent-Length: 20\r\n\r\n{\"code\": \"print(5)\"}", b"200"),
    (_request(b'{"code": "print(6)"}', extra=b"Expect: 100-continue\r\n"), b"200"),
    (b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}", b"400"),
    (b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"400"),
    (b"POST /run HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"400"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 32, b"400"),  # a TLS hello
], ids=["wrong_method", "unknown_path", "http_1_0", "expect_100", "two_lengths", "negative_length", "bad_chunk", "tls_hello"])
def test_odd_http_gets_an_http_answer(impatient_sandbox: ServiceProcess, raw: bytes, status: bytes) -> None:
    sock = _raw(impatient_sandbox.port)
    sock.sendall(raw)
    answer = _read_response(sock) if status == b"200" else sock.recv(65536)
    sock.close()
    if status == b"200":  # after a "100 Continue" where one was asked for
        assert b"HTTP/1.1 200" in answer and b'"status": "ok"' in answer, answer[:300]
    else:
        assert answer.split(b" ", 2)[1] == status or answer == b"", answer[:300]
    assert httpx.get(f"{impatient_sandbox.url}/health", timeout=30).json()["status"] == "ok"
