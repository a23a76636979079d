"""The search service answers every input with an answer or a 4xx, never a 500, at a bounded cost.

Undecodable text (invalid UTF-8, lone surrogates written as JSON escapes), wrong types, deep nesting,
non-finite numbers and random bytes are 422; bodies over the limit are 413 before they are read whole,
however they are sent; a provider's unwritable text is cleaned, not passed on. Over real HTTP on
loopback against the session's service (`tests/search/conftest.py`).
"""

from __future__ import annotations

import json
import socket

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from pipeline.config.search import SearchConfig
from pipeline.services.processes import ServiceProcess
from sandbox.search.app import MAX_BATCH, RetrieveRequest, SearchRequest, body_limit
from tests.search.fake_serper import FakeSerper

JSON = {"content-type": "application/json"}
MAX_QUERY_CHARS = SearchConfig().max_query_chars
LIMIT = body_limit(MAX_QUERY_CHARS)
# What one oversized request may add to the service's memory: the limit plus the server's own slack,
# far below the 64 MiB offered (which, read and parsed, added about 200 MB).
RSS_BOUND = 32 << 20


def _post(service: ServiceProcess, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{service.url}{path}", content=body, headers=JSON, timeout=30)


def _rss(service: ServiceProcess) -> int:
    return psutil.Process(service.process.pid).memory_info().rss


def _raw(service: ServiceProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", service.port), timeout=30)


def _answer(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and data.rstrip().endswith(b"}"):
                break
    except (ConnectionResetError, TimeoutError):
        pass
    return data


@pytest.mark.parametrize("path, body", [
    ("/search", b'{"query": "\\ud83d"}'),                       # a high surrogate alone
    ("/search", b'{"query": "\\udfff"}'),                       # a low one
    ("/search", b'{"query": "who wrote \\ude00\\ud83d"}'),      # a pair in the wrong order
    ("/search", b'{"query": "x\\ud83d", "top_k": 2}'),
    ("/search", b'{"query": "x", "extra\\ud800": 1}'),          # in a key the error would name
    ("/retrieve", b'{"queries": ["fine", "\\ud83d"]}'),
    ("/retrieve", b'{"queries": ["\\udbff"], "topk": 2, "return_scores": true}'),
], ids=["high", "low", "reversed_pair", "with_top_k", "in_a_key", "retrieve_second", "retrieve_scores"])
def test_search_bad_input_lone_surrogates_are_422(local_service: ServiceProcess, path: str, body: bytes) -> None:
    response = _post(local_service, path, body)
    assert response.status_code == 422, (response.status_code, response.text[:300])
    assert isinstance(response.json()["detail"], list)


def test_search_bad_input_a_surrogate_pair_is_text(local_service: ServiceProcess) -> None:
    """The escape of a real non-BMP character is no lone surrogate: it is searched, and echoed whole."""
    response = _post(local_service, "/search", b'{"query": "Constantin Medien \\ud83d\\ude00"}')
    assert response.status_code == 200, response.text
    assert response.json()["query"] == "Constantin Medien \U0001F600"


@pytest.mark.parametrize("body", [
    b'{"query": "\xff"}', b'{"query": "caf\xc3"}', b'{"query": "\xc0\xaf"}', b'{"query": "\xed\xa0\xbd"}',
    b'\xfe\xff\x00{', b'{"queries": ["\xe2\x82"]}',
], ids=["ff", "truncated", "overlong", "cesu_surrogate", "utf16_bom", "retrieve_truncated"])
def test_search_bad_input_invalid_utf8_is_422(local_service: ServiceProcess, body: bytes) -> None:
    path = "/retrieve" if b"queries" in body else "/search"
    response = _post(local_service, path, body)
    assert response.status_code == 422, (response.status_code, response.text[:300])


@pytest.mark.parametrize("body", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"query": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}",
    b'{"query": "x", "top_k": NaN}', b'{"query": "x", "top_k": 1e999}', b'{"query": "x", "top_k": -Infinity}',
    b'{"query": "x", "top_k": ' + b"9" * 100_000 + b"}",
    b'{"query": ["x"]}', b'{"query": null}', b'{"queries": "x"}', b'"just a string"', b"", b"null",
    b'{"query": "x"} trailing', b'{"query": "x", "query": 5}',
], ids=["nested_lists", "nested_objects", "nan", "overflow", "minus_inf", "huge_int", "list_query", "null_query",
        "string_queries", "string_body", "empty", "null_body", "trailing", "duplicate_key"])
def test_search_bad_input_wrong_shapes_are_422(local_service: ServiceProcess, body: bytes) -> None:
    path = "/retrieve" if b"queries" in body else "/search"
    response = _post(local_service, path, body)
    assert response.status_code == 422, (response.status_code, response.text[:300])


def test_search_bad_input_requests_built_in_python_refuse_surrogates() -> None:
    with pytest.raises(ValidationError):
        SearchRequest.model_validate({"query": "x\ud83d"})
    with pytest.raises(ValidationError):
        RetrieveRequest.model_validate({"queries": ["ok", "\udc00"]})
    assert SearchRequest.model_validate({"query": "\U0001F600"}).query == "\U0001F600"


def test_search_bad_input_the_largest_legal_request_fits_the_body_limit() -> None:
    """A full batch of the longest queries, every character at its longest escape, pretty-printed."""
    body = json.dumps({"queries": ["\U0001F600" * MAX_QUERY_CHARS] * MAX_BATCH, "topk": 50, "return_scores": True},
                      indent=1).encode()
    assert len(body) <= LIMIT < 4 << 20


def test_search_bad_input_a_declared_oversized_body_is_413_unread(local_service: ServiceProcess) -> None:
    sock = _raw(local_service)
    sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 67108864\r\n\r\n{\"query\": \"")
    answer = _answer(sock)  # at once: the server does not wait for 64 MiB it would refuse
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_search_bad_input_a_chunked_oversized_body_is_413_unread(local_service: ServiceProcess) -> None:
    before = _rss(local_service)
    sock = _raw(local_service)
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"a" * 65536
    sent = 0
    try:
        for _ in range(64 * 16):  # offers 64 MiB; the server stops reading at the limit
            sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    answer = _answer(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 64 << 20 or b"413" in answer
    assert _rss(local_service) - before < RSS_BOUND


def test_search_bad_input_a_declared_body_at_the_limit_is_read(local_service: ServiceProcess) -> None:
    """The limit is the one computed, not a smaller one: a padded legal body just under it is answered."""
    body = b'{"query": "Constantin Medien"' + b" " * (LIMIT - 40) + b"}"
    assert len(body) <= LIMIT
    assert _post(local_service, "/search", body).status_code == 200
    assert _post(local_service, "/search", body + b" " * 64).status_code == 413


def test_search_bad_input_provider_text_is_cleaned(serper_service: tuple[ServiceProcess, FakeSerper]) -> None:
    """A provider's JSON may decode to lone surrogates: the answer carries U+FFFD instead, never a 500."""
    service, fake = serper_service
    fake.mode = "surrogates"
    try:
        response = httpx.post(f"{service.url}/search", json={"query": "who escapes half an emoji"}, timeout=30)
    finally:
        fake.mode = "ok"
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["title"] for r in results] == ["\ufffd", "T\ufffd"]
    assert results[0]["text"] == "half \ufffd an emoji" and results[1]["text"] == "s\U0001F600 ok \ufffd"
    assert [r["url"] for r in results] == [None, None]  # links that were not strings
    response.content.decode("utf-8")  # writable text all through


SURROGATES = st.text(st.characters(categories=["Cs", "Ll", "Nd", "Zs"]), min_size=1, max_size=12)
LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | SURROGATES
VALUES = st.recursive(LEAVES, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(SURROGATES, kids, max_size=3),
                      max_leaves=10)
FIELDS = ["query", "top_k", "queries", "topk", "return_scores", "extra"]


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "field", "nested", "long"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "nested":
        depth = draw(st.integers(1, 20_000))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'{"query":', b"}")]))
        return opener * depth + b"1" + closer * depth
    if kind == "long":  # past the query limit, or past the body limit
        return json.dumps({"query": "q" * draw(st.sampled_from([MAX_QUERY_CHARS + 1, LIMIT + 1]))}).encode()
    body = {"query": "Constantin Medien", "queries": ["VIVA Polska"], draw(st.sampled_from(FIELDS)): draw(VALUES)}
    return json.dumps(body, allow_nan=True).encode()  # lone surrogates become \ud8xx escapes


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(bodies(), st.sampled_from(["/search", "/retrieve", "/health", "/stats", "/nowhere"]),
       st.sampled_from(["POST", "GET", "PUT"]))
def test_search_bad_input_fuzzed_requests_get_an_answer_or_a_4xx(local_service: ServiceProcess, body: bytes,
                                                                  path: str, method: str) -> None:
    response = httpx.request(method, f"{local_service.url}{path}", content=body, headers=JSON, timeout=30)
    assert response.status_code in (200, 404, 405, 413, 422), (response.status_code, response.text[:300])
    response.json()


def test_search_bad_input_fuzz_leaves_the_service_small(local_service: ServiceProcess) -> None:
    """Memory stays bounded over many refused requests of every kind (what the fuzz above sends)."""
    before = _rss(local_service)
    for body in (b"[" * 500_000 + b"]" * 500_000, b'{"query": "' + b"\\ud83d" * 200_000 + b'"}', b"\xff" * LIMIT):
        for _ in range(5):
            assert _post(local_service, "/retrieve", body).status_code in (413, 422)
    assert _rss(local_service) - before < RSS_BOUND


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.text(min_size=1, max_size=MAX_QUERY_CHARS), st.sampled_from(["/search", "/retrieve"]))
def test_search_bad_input_refuses_no_decodable_query(local_service: ServiceProcess, query: str, path: str) -> None:
    """The other side of the refusals: any text a client can write (NUL, controls, any script, non-BMP
    characters, whitespace only) is searched."""
    body = {"query": query} if path == "/search" else {"queries": [query, query[::-1]], "return_scores": True}
    response = httpx.post(f"{local_service.url}{path}", json=body, timeout=30)
    assert response.status_code == 200, (response.status_code, response.text[:300], ascii(query))
