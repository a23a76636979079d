"""A scripted OpenAI-compatible chat-completions server on loopback, for tests and benchmarks.

It stands in for paid judge APIs (GPT-4o, DeepSeek, Gemini) that tests cannot reach. It is a
real HTTP server (threaded, HTTP/1.1 keep-alive) speaking the chat-completions wire format
with function calling, and it behaves deterministically from a `Script`:

- a model listed in `Script.tool` first calls that tool (when it is offered) with the question
  (search) or with `print(<answer>)` (code), then answers with \\boxed{gold} only if the gold
  answer appears in the tool's output, proving the tool really ran and its output came back;
- other models answer from `Script.answers`, or \\boxed{unknown} for an unknown question;
- `Script.wrong[model]` lists questions that model gets wrong;
- `Script.fail_first[model]` = n: the first n requests for each question get HTTP 503;
- `Script.status[model]` = code: every request gets that HTTP status;
- a model in `Script.verdicts` is a classifier: it says YES for the questions listed, else NO;
- a model in `Script.says` answers every request with that text, calling no tool (an endpoint that is up
  but broken: empty answers, or prose with no \\boxed{} answer and no verdict);
- `Script.latency_s` delays every response (benchmarks of concurrency);
- `Script.die_after` = n: run as its own process, it SIGKILLs itself right after its n-th answer
  (fault tests: a judge endpoint that dies mid-run, for real).

Run in-process (`with ScriptedOpenAIServer(script) as server`) or as its own process, so the
client under test does not share a GIL with it: `python -m tests.data.openai_server --host
127.0.0.1 --port PORT --script script.json` (GET /health answers 200 once it is up).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Script:
    answers: dict[str, str]
    tool: dict[str, str] = field(default_factory=dict)
    wrong: dict[str, set[str]] = field(default_factory=dict)
    fail_first: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    verdicts: dict[str, set[str]] = field(default_factory=dict)
    says: dict[str, str] = field(default_factory=dict)
    latency_s: float = 0.0
    api_key: str = ""
    die_after: int = 0


def _question(messages: list[dict[str, Any]]) -> str:
    return next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")


def _reply(script: Script, model: str, body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or []
    question = _question(messages)
    gold = script.answers.get(question)
    tool = script.tool.get(model)
    offered = set() if body.get("tool_choice") == "none" else {t["function"]["name"] for t in body.get("tools") or []}
    tool_outputs = [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if model in script.says:
        message["content"] = script.says[model]
    elif model in script.verdicts:
        message["content"] = "YES" if question in script.verdicts[model] else "NO"
    elif question in script.wrong.get(model, set()):
        message["content"] = "I think it is \\boxed{definitely wrong}."
    elif tool and tool in offered and not tool_outputs:
        arguments = {"query": question} if tool == "search" else {"code": f"print({gold or 'None'!r})"}
        message["tool_calls"] = [{"id": f"call_{len(messages)}", "type": "function",
                                  "function": {"name": tool, "arguments": json.dumps(arguments)}}]
    elif tool:
        seen = gold is not None and any(gold in out for out in tool_outputs)
        message["content"] = f"From the tool output, the answer is \\boxed{{{gold if seen else 'unknown'}}}."
    else:
        message["content"] = f"The answer is \\boxed{{{gold if gold is not None else 'unknown'}}}."
    prompt_chars = sum(len(json.dumps(m)) for m in messages)
    completion_chars = len(json.dumps(message))
    return {"id": "chatcmpl-test", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
            "usage": {"prompt_tokens": prompt_chars // 4 + 1, "completion_tokens": completion_chars // 4 + 1,
                      "total_tokens": prompt_chars // 4 + completion_chars // 4 + 2}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 resets connections at concurrency 32


class ScriptedOpenAIServer:
    """`with ScriptedOpenAIServer(script) as server:` -> `server.url` ends in /v1."""

    def __init__(self, script: Script, host: str = "127.0.0.1", port: int = 0, *, may_die: bool = False) -> None:
        self.script = script
        self.may_die = may_die  # only a server in its own process may honour Script.die_after
        self.answered = 0
        self.requests: Counter[str] = Counter()  # model -> HTTP requests received
        self.failures_left: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._server = _Server((host, port), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _status_for(self, model: str, question: str) -> int:
        with self._lock:
            self.requests[model] += 1
            if model in self.script.status:
                return self.script.status[model]
            key = (model, question)
            left = self.failures_left.setdefault(key, self.script.fail_first.get(model, 0))
            if left > 0:
                self.failures_left[key] = left - 1
                return 503
        return 200

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; with Nagle on, keep-alive clients wait for a
            # delayed ACK (~40 ms) on every response, which would swamp the injected latency.
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:  # keep test output quiet
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                if self.path == "/health":
                    return self._send(200, {"status": "ok"})
                return self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if outer.script.api_key and self.headers.get("Authorization") != f"Bearer {outer.script.api_key}":
                    return self._send(401, {"error": {"message": "bad api key"}})
                model = str(body.get("model", ""))
                status = outer._status_for(model, _question(body.get("messages") or []))  # counted on arrival
                if outer.script.latency_s:
                    time.sleep(outer.script.latency_s)
                if status != 200:
                    return self._send(status, {"error": {"message": f"scripted {status}"}})
                self._send(200, _reply(outer.script, model, body))
                with outer._lock:
                    outer.answered += 1
                    dying = outer.may_die and outer.script.die_after and outer.answered >= outer.script.die_after
                if dying:
                    self.wfile.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
                return None

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible server (tests, benchmarks).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", required=True, help="JSON file with the Script fields.")
    args = parser.parse_args()
    raw = json.loads(open(args.script, encoding="utf-8").read())
    raw["wrong"] = {m: set(qs) for m, qs in raw.get("wrong", {}).items()}
    raw["verdicts"] = {m: set(qs) for m, qs in raw.get("verdicts", {}).items()}
    server = ScriptedOpenAIServer(Script(**raw), args.host, args.port, may_die=True)
    server._server.serve_forever()


if __name__ == "__main__":
    main()
