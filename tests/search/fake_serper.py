"""A fake Serper.dev API: a real HTTP server on 127.0.0.1 in a thread, answering in Serper's JSON shape.

`mode` switches behaviour: "ok" (canned answer box, knowledge graph and organic results), "error"
(HTTP 500), "garbage" (200 with non-JSON), "slow" (sleeps past any client timeout), "delay" (answers after 0.3 s),
"surrogates" (valid JSON whose strings escape lone surrogates and whose links are not strings). Requests and
their X-API-KEY headers are recorded for assertions.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "test-key-123"


def serper_answer(query: str, num: int) -> dict:
    organic = [{"title": f"Result {i} for {query}", "link": f"https://example.org/{i}",
                "snippet": f"Snippet {i} about {query}.", "position": i} for i in range(1, num + 1)]
    return {
        "searchParameters": {"q": query, "num": num, "type": "search", "engine": "google"},
        "answerBox": {"title": "Answer", "answer": f"The answer to {query}", "link": "https://example.org/answer"},
        "knowledgeGraph": {"title": "Graph", "description": f"Knowledge about {query}",
                           "descriptionLink": "https://en.wikipedia.org/wiki/Graph"},
        "organic": organic,
    }


# Legal JSON that decodes to lone surrogates in Python, with links of the wrong type.
SURROGATE_ANSWER = (b'{"answerBox": {"title": "\\ud83d", "answer": "half \\udfff an emoji", "link": 5},'
                    b' "organic": [{"title": "T\\ud800", "snippet": "s\\ud83d\\ude00 ok \\ud83d", "link": ["x"]}]}')


class FakeSerper:
    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[tuple[str, dict]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.headers.get("X-API-KEY", ""), body))
                if fake.mode == "slow":
                    time.sleep(3)
                elif fake.mode == "delay":
                    time.sleep(0.3)
                if fake.mode == "error" or self.headers.get("X-API-KEY") != API_KEY:
                    self._send(500 if fake.mode == "error" else 403, b'{"message": "failed"}')
                elif fake.mode == "garbage":
                    self._send(200, b"<html>not json</html>")
                elif fake.mode == "surrogates":
                    self._send(200, SURROGATE_ANSWER)
                else:
                    self._send(200, json.dumps(serper_answer(body["q"], int(body.get("num", 10)))).encode())

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                try:
                    self.wfile.write(payload)
                except BrokenPipeError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/search"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSerper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
