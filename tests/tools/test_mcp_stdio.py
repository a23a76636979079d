"""The stdio transport's readers, as properties (`pipeline.tools.mcp_stdio`): lines come out the same however the
stream is chunked, a line over the limit comes out as its length and its start (never more held), an over-long
answer's id is read from its start only when it is the message's own (never a nested "id"), and every line a
server can write is a message, a blank, or a `BadLine`: nothing else escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tools.mcp_stdio import ANSWER_TOO_LARGE, BadLine, LineSplitter, Oversize, message_of, top_level_id

LIMIT = 64
LINES = st.lists(st.binary(max_size=3 * LIMIT).map(lambda b: b.replace(b"\n", b"")), max_size=8)


@settings(max_examples=200)
@given(lines=LINES, cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_line_splitter_is_independent_of_chunking(lines: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    splitter, out, start = LineSplitter(LIMIT), [], 0
    for cut in sorted(min(c, len(stream)) for c in cuts) + [len(stream)]:
        out += splitter.feed(stream[start:cut])
        start = cut
    assert len(out) == len(lines)
    for line, got in zip(lines, out):
        if len(line) <= LIMIT:
            assert got == line
        else:
            assert isinstance(got, Oversize) and got.size == len(line) and line.startswith(got.prefix)


ID = st.one_of(st.integers(-10**6, 10**6), st.text(max_size=8), st.from_regex(r"\A[0-9 ]{1,8}\Z"))
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                              st.sampled_from(["id", "x", "result", "\"id\""]), inner, max_size=3), max_leaves=12)


@settings(max_examples=500)
@given(request_id=ID, result=JSON_VALUE, id_first=st.booleans(), cut=st.integers(min_value=0, max_value=400))
def test_top_level_id_is_the_messages_own_or_none(request_id, result, id_first: bool, cut: int) -> None:
    fields = [("id", request_id), ("result", result)]
    message = {"jsonrpc": "2.0", **dict(fields if id_first else fields[::-1])}
    line = json.dumps(message).encode()
    found = top_level_id(line[:cut])
    assert found is None or found == request_id  # a nested "id" is never taken for the message's
    if id_first:
        assert top_level_id(line) == request_id


@settings(max_examples=300)
@given(line=st.one_of(st.binary(max_size=200), JSON_VALUE.map(lambda v: json.dumps(v).encode()),
                      st.text(max_size=50).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_every_line_is_a_message_a_blank_or_a_bad_line(line: bytes) -> None:
    line = line.replace(b"\n", b" ")
    try:
        message_of(line, 1 << 20)
    except BadLine:
        pass


def test_an_over_long_answer_becomes_its_requests_error() -> None:
    message = message_of(Oversize(b'{"jsonrpc": "2.0", "id": 7, "result": {"content": [{"text": "xxx', 5000), 1024)
    assert message.message.id == 7 and message.message.error.code == ANSWER_TOO_LARGE
    with pytest.raises(BadLine, match="whose id could not be read"):
        message_of(Oversize(b'{"jsonrpc": "2.0", "result": {"id": 7, "content": "xxx', 5000), 1024)
