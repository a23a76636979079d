"""The streamable HTTP transport of an MCP server at a URL, with its answers bounded as the stdio ones are
(`pipeline.tools.mcp_stdio`): the `mcp` package bounds an SSE event (`max_sse_event_size`) but reads a JSON answer
whole. Here the HTTP client's transport stops reading a JSON answer past `max_answer_bytes`
(`AnswerOverLimit`, which the package turns into the request's error), and SSE events get the same limit.
`answer_too_large(err)` tells a call's error that says either from the other errors, which are outages, and
`connection_gone(err)` one that says the connection must be made again (a stdio server that went away, or an HTTP
server that no longer knows the session: it was restarted).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import mcp_types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.exceptions import MCPError

_OVER = "over the limit of"  # in both errors' messages below
_SSE_OVER = "byte limit"  # httpx2's SSEError: "Server-sent event exceeded the N byte limit."


class AnswerOverLimit(httpx2.StreamError):
    """A JSON answer longer than the limit: not read further."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer was {_OVER} {limit} bytes (max_answer_bytes); it was not read")


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: Any, limit: int) -> None:
        self._stream, self._limit = stream, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._limit:
                raise AnswerOverLimit(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    """Bounds every answer but an SSE stream (a long-lived one carries many events; each is bounded by itself)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith("text/event-stream"):
            return response
        return httpx2.Response(response.status_code, headers=response.headers,
                               stream=_BoundedStream(response.stream, self._limit), extensions=response.extensions)

    async def aclose(self) -> None:
        await self._inner.aclose()


def bounded_http_client(url: str, max_answer_bytes: int) -> Any:
    """The MCP transport (an async context manager of the message streams) for the server at `url`, with the
    package's own HTTP client settings (`create_mcp_http_client`: its timeouts)."""
    http = httpx2.AsyncClient(timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
                              transport=_BoundedTransport(httpx2.AsyncHTTPTransport(), max_answer_bytes))
    return streamable_http_client(url, http_client=http, max_sse_event_size=max_answer_bytes)


def answer_too_large(err: BaseException) -> bool:
    """Whether a call's error says its answer was over the limit (JSON or SSE), rather than an outage."""
    return isinstance(err, MCPError) and err.code in (mcp_types.PARSE_ERROR, mcp_types.CONNECTION_CLOSED) and (
        _OVER in err.message or _SSE_OVER in err.message)


def connection_gone(err: MCPError) -> bool:
    """Whether a call's error says the connection is gone (not the call's own failure)."""
    if answer_too_large(err):
        return False
    return err.code == mcp_types.CONNECTION_CLOSED or (err.code == mcp_types.INVALID_REQUEST
                                                       and err.message == "Session terminated")
