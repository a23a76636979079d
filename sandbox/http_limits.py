"""What one HTTP request may cost a service before its handler sees it: the code sandbox and the
search service both serve behind these, so neither reads a body it will refuse.

* `BodyLimits` (pure ASGI) reads the body itself, counting bytes as they arrive, so a
  chunked body (no Content-Length) is cut at the limit exactly like a declared one: 413
  without reading further. The whole body must arrive within `body_timeout_s` (408 after),
  and bodies being read at once hold at most `MAX_BUFFERED_BYTES` between them (503 with
  Retry-After beyond it), so many slow uploads cannot add up to gigabytes.
* `BoundedHttpToolsProtocol` (uvicorn's httptools protocol plus a deadline) closes a
  connection whose request line and headers have not all arrived `header_timeout_s` after
  the connection opened or the previous response was sent, and one whose headers pass
  `MAX_HEADER_BYTES` (slowloris: thousands of half-sent requests would otherwise be held
  for ever).
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024
MAX_BUFFERED_BYTES = 128 << 20


def json_response_bytes(body: dict) -> bytes:
    return json.dumps(body).encode()


async def _send_json(send, status: int, body: dict, extra_headers: tuple = ()) -> None:
    payload = json_response_bytes(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"), *extra_headers]})
    await send({"type": "http.response.body", "body": payload})


class BodyLimits:
    """Refuse a body over `limit` bytes however it is sent, and one that arrives too slowly."""

    def __init__(self, app, limit: int, timeout_s: float, max_buffered: int = MAX_BUFFERED_BYTES) -> None:
        self.app, self.limit, self.timeout_s, self.max_buffered = app, limit, timeout_s, max_buffered
        self.buffered = 0  # bytes held by bodies still being read, all connections together

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await _send_json(send, 413, {"detail": f"request body is {int(value)} bytes; the limit is {self.limit} bytes"})
                return
        try:
            body = await self._read_body(receive, send)
        except _Answered:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive, send) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        raise _Answered  # the client went away
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.limit:
                        await _send_json(send, 413, {"detail": f"request body is over the limit of {self.limit} bytes"})
                        raise _Answered
                    if self.buffered + len(chunk) > self.max_buffered:
                        await _send_json(send, 503, {"detail": "too many request bodies in flight; retry later"},
                                         ((b"retry-after", b"1"),))
                        raise _Answered
                    self.buffered += len(chunk)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _send_json(send, 408, {"detail": f"request body did not arrive within {self.timeout_s:g} s"})
            raise _Answered from None
        finally:
            self.buffered -= sum(len(c) for c in chunks)
        return b"".join(chunks)


class _Answered(Exception):
    """The request was answered (or abandoned) while its body was read."""


def _replay(body: bytes, receive):
    delivered = False

    async def replayed():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def bounded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline and a size cap on the request head."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _head_deadline: asyncio.TimerHandle | None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes = 0
            self._awaiting_head = True
            self._head_deadline = None
            self._arm_head_deadline()

        def _arm_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            self._head_deadline = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _head_too_slow(self) -> None:
            self._head_deadline = None
            if self._awaiting_head and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._awaiting_head:  # still no complete head after these bytes
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                    self.transport.close()

        def on_message_begin(self) -> None:
            self._awaiting_head = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._awaiting_head = False
            self._head_bytes = 0
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._awaiting_head = True
            self._head_bytes = 0
            self._arm_head_deadline()

        def connection_lost(self, exc) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            super().connection_lost(exc)

    return BoundedHttpToolsProtocol
