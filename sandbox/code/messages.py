"""Messages between the HTTP server and its workers: length-prefixed JSON over a socketpair.

Only the server and the (trusted, root) worker speak this; snippet processes never hold
the socket (they are forked from the zygote, which closed it, and close every inherited
descriptor above 3 before running). An answer may carry `retire`: the worker cannot serve
another request cleanly (the reason), and exits after sending it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import asdict, dataclass, field

_HEADER = struct.Struct(">I")
MAX_MESSAGE_BYTES = 16 << 20

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "rejected")


@dataclass(frozen=True)
class Job:
    """One snippet to run. Limits are already capped by the server."""

    code: str
    timeout_s: float
    memory_mb: int
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)  # relative path -> base64 content
    fetch_files: tuple[str, ...] = ()
    seed: int | None = None  # the snippet's random generators start from it; None: fresh entropy


@dataclass(frozen=True)
class Outcome:
    """What a snippet did. `error` is the last traceback line (ToRL-style) or a short reason."""

    status: str
    stdout: str
    stderr: str
    error: str | None
    duration_ms: float
    return_code: int | None = None
    files: dict[str, str] = field(default_factory=dict)  # fetched files, base64

    def public(self) -> dict:
        """The `POST /run` response body."""
        return {"status": self.status, "stdout": self.stdout, "stderr": self.stderr, "error": self.error,
                "duration_ms": round(self.duration_ms, 3)}


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def _decode_length(header: bytes) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"message of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
    return length


def recv_blocking(sock: socket.socket) -> dict | None:
    """The next message, or None when the peer closed the socket."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    body = _recv_exact(sock, _decode_length(header))
    if body is None:
        return None
    return json.loads(body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


async def recv_async(reader: asyncio.StreamReader) -> dict:
    header = await reader.readexactly(_HEADER.size)
    body = await reader.readexactly(_decode_length(header))
    return json.loads(body)


def job_message(job: Job) -> dict:
    message = asdict(job)
    message["fetch_files"] = list(job.fetch_files)
    return message


def outcome_from_message(message: dict) -> tuple[Outcome, str | None]:
    """The outcome, and the reason the worker retired after it (None if it can go on serving)."""
    retire = message.pop("retire", None)
    return Outcome(**message), retire
