"""A hostile MCP server over stdio for the supervision tests: `python tests/tools/hostile_mcp.py MODE [N] [--no-term]`.

It speaks raw JSON-RPC (no `mcp` import, so it starts in milliseconds) with one tool, `echo(text)`, and misbehaves
as MODE says:

- `ok`: behaves;
- `never-initializes`: reads its stdin and never answers anything;
- `exits-after N`: answers N calls, then exits (code 3) at the next one;
- `bad-utf8-after N` / `not-json-after N`: answers N calls, then writes one invalid UTF-8 / non-JSON line (and
  answers the call after it);
- `floods-after N`: answers N calls, then writes N... lines of noise (100,000 of them) before answering;
- `huge N`: answers each call with a text of N bytes (written in pieces, as a real server would);
- `huge-late-id N`: the same, but writes the `id` after the result (no id can be read from the line's start);
- `notifies-after N`: answers N calls, then sends 100,000 valid log notifications before answering;
- `lone-surrogate`: answers each call with its text after a lone surrogate (`"\\ud83d"`, valid JSON);
- `drips`: answers each call one byte at a time, 20 ms apart;
- `exits-at-start`: exits before reading anything;
- `stderr-flood N`: writes N bytes to its stderr at start, then behaves.

`--no-term` ignores SIGTERM (only SIGKILL ends it). Each start appends a line to the file named by the
HOSTILE_MCP_STARTS environment variable, if set, so a test can count restarts and find every process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def send(message: dict) -> None:
    sys.stdout.buffer.write(json.dumps(message).encode() + b"\n")
    sys.stdout.buffer.flush()


def answer(request: dict, result: dict) -> None:
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})


TOOL = {"name": "echo", "description": "Say the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}


def text_result(text: str) -> dict:
    return {"content": [{"type": "text", "text": text}], "isError": False}


def huge(request: dict, size: int, id_last: bool) -> None:
    """A result of `size` bytes of text, written in 1 MiB pieces; the id first, or after the result."""
    head = {"jsonrpc": "2.0"} if id_last else {"jsonrpc": "2.0", "id": request["id"]}
    out = sys.stdout.buffer
    out.write(json.dumps(head)[:-1].encode() + b', "result": {"content": [{"type": "text", "text": "')
    piece = b"x" * (1 << 20)
    left = size
    while left > 0:
        out.write(piece[:left])
        left -= len(piece)
    tail = b'"}], "isError": false}' + (f', "id": {json.dumps(request["id"])}'.encode() if id_last else b"") + b"}\n"
    out.write(tail)
    out.flush()


def call(request: dict, mode: str, n: int, calls: int) -> None:
    text = request["params"]["arguments"].get("text", "")
    if mode == "exits-after" and calls > n:
        os._exit(3)
    if mode == "bad-utf8-after" and calls == n + 1:
        sys.stdout.buffer.write(b"\xff\xfe not utf-8\n")
    if mode == "not-json-after" and calls == n + 1:
        sys.stdout.buffer.write(b"Server says hello\n")
    if mode == "floods-after" and calls == n + 1:
        sys.stdout.buffer.write(b"noise noise noise\n" * 100_000)
    if mode == "notifies-after" and calls == n + 1:
        note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                           "params": {"level": "info", "data": "busy"}}).encode() + b"\n"
        sys.stdout.buffer.write(note * 100_000)
    if mode == "lone-surrogate":
        text = "\ud83d" + text
    if mode in ("huge", "huge-late-id"):
        huge(request, n, mode == "huge-late-id")
        return
    if mode == "drips":
        for byte in json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": text_result(text)}).encode() + b"\n":
            sys.stdout.buffer.write(bytes([byte]))
            sys.stdout.buffer.flush()
            time.sleep(0.02)
        return
    answer(request, text_result(text))


def main() -> None:
    mode, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 0
    if "--no-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("HOSTILE_MCP_STARTS"):
        with open(os.environ["HOSTILE_MCP_STARTS"], "a") as starts:
            starts.write(f"{os.getpid()}\n")
    if mode == "exits-at-start":
        os._exit(3)
    if mode == "stderr-flood":
        sys.stderr.write("e" * n)
        sys.stderr.flush()
    calls = 0
    for line in sys.stdin:
        request = json.loads(line)
        if mode == "never-initializes" or "id" not in request:
            continue  # never answers / a notification
        method = request["method"]
        if method == "initialize":
            answer(request, {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
                             "serverInfo": {"name": "hostile", "version": "0"}})
        elif method == "tools/list":
            answer(request, {"tools": [TOOL]})
        elif method == "tools/call":
            calls += 1
            call(request, mode, n, calls)
        else:  # server/discover and anything else: not supported (the client falls back to initialize)
            send({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32601, "message": "no such method"}})


if __name__ == "__main__":
    main()
