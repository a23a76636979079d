"""A stand-in for vLLM's server with the routes pipeline.inference speaks, for testing supervision, routing, retries
and the push sequence in the main environment in seconds (tests/vllm/test_server_*.py run the real one).

Standard library only. `python fake_server.py --port P [--token-delay S]`. Token i of an answer is
(sum(prompt) + i) % 97 with log-prob -1; pause (mode keep) freezes answers in flight, resume continues them, and the
spans of `weight_versions` say which version each token was sampled under. It starts a child process of its own
(as vLLM starts its engine and workers) and a shared-memory segment, and ends and unlinks them on SIGTERM, as vLLM
does.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing import shared_memory
from urllib.parse import parse_qs, urlsplit

STATE = {"paused": False, "version": "default", "loads": 0, "requests": 0, "calls": [], "world_size": 1,
         "generated": 0}  # tokens generated so far: tests act mid-request once there are some
LOCK = threading.Condition()
# NCCL stand-in: the trainer's side tells the "workers" that it joined the group / that its broadcast arrived
JOINED, RECEIVED = threading.Event(), threading.Event()
NCCL_WAIT_S = 20.0  # a worker blocked on a trainer that never comes answers 500 after this (the test fails, no hang)


def generate(body: dict, token_delay: float) -> dict:
    params = body["sampling_params"]
    base = sum(body["token_ids"])
    ids, spans = [], []
    for i in range(params["max_tokens"]):
        with LOCK:
            while STATE["paused"]:
                LOCK.wait()
            version = STATE["version"]
        time.sleep(token_delay)
        ids.append((base + i) % 97)
        with LOCK:
            STATE["generated"] += 1
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] += 1
        else:
            spans.append({"version": version, "start": i, "end": i + 1})
    content = [{"token_id": t, "logprob": -1.0, "top_logprobs": []} for t in ids]
    return {"choices": [{"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": ids,
                         "weight_versions": spans, "logprobs": {"content": content}}],
            "usage": {"prompt_tokens": len(body["token_ids"]), "prompt_tokens_details": {"cached_tokens": 0}}}


class Handler(BaseHTTPRequestHandler):
    token_delay = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, code: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        route = urlsplit(self.path).path
        if route == "/health":
            self._answer(200, {})
        elif route == "/weight_info":
            self._answer(200, {"weight_version": STATE["version"]})
        elif route == "/_generated":
            self._answer(200, {"generated": STATE["generated"]})
        elif route == "/get_world_size":
            self._answer(200, {"world_size": STATE["world_size"]})
        elif route == "/_calls":
            self._answer(200, STATE["calls"])
        else:
            self._answer(404, {"detail": route})

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
        if not parts.path.startswith("/inference"):
            STATE["calls"].append([parts.path, body])
        if parts.path in ("/_joined", "/_received"):
            (JOINED if parts.path == "/_joined" else RECEIVED).set()
            return self._answer(200, {})
        if parts.path in ("/init_weight_transfer_engine", "/update_weights"):  # block in the "NCCL" call, as vLLM does
            event = JOINED if parts.path == "/init_weight_transfer_engine" else RECEIVED
            if not event.wait(NCCL_WAIT_S):
                return self._answer(500, {"detail": f"{parts.path}: the trainer never took part"})
            event.clear()
            return self._answer(200, {})
        if parts.path in ("/start_weight_update", "/finish_weight_update"):
            if parts.path == "/finish_weight_update" and body and body.get("weight_version"):
                STATE["version"] = body["weight_version"]
            return self._answer(200, {})
        if parts.path == "/inference/v1/generate":
            STATE["requests"] += 1
            if len(body["token_ids"]) > 1000:
                return self._answer(400, {"detail": "prompt too long"})
            if body["token_ids"][0] == 999 and not STATE.get("failed_once"):  # one transient server error
                STATE["failed_once"] = True
                return self._answer(500, {"detail": "transient"})
            return self._answer(200, generate(body, self.token_delay))
        with LOCK:
            if parts.path == "/pause":
                STATE["paused"] = parse_qs(parts.query).get("mode") == ["keep"]
            elif parts.path == "/resume":
                STATE["paused"] = False
            elif parts.path == "/update_weight_version":
                STATE["version"] = body["new_version"]
            elif parts.path == "/collective_rpc" and body["method"] == "tapo_load_file":
                if body["args"][1] == "13":  # the receiver's refusal (a file that is not the checkpoint's)
                    return self._answer(200, {"results": [{"loaded": 0, "refused": "not the checkpoint's"}]})
                STATE["loads"] += 1
                return self._answer(200, {"results": [{"loaded": 1, "refused": ""}]})
            elif parts.path == "/collective_rpc" and body["method"] == "tapo_layout":
                return self._answer(200, {"results": [{"w": [[2, 2], "F32"]}]})
            else:
                return self._answer(404, {"detail": parts.path})
            LOCK.notify_all()
        self._answer(200, {})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()
    STATE["world_size"] = args.world_size
    Handler.token_delay = args.token_delay
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # the "engine" child
    segment = shared_memory.SharedMemory(create=True, size=1 << 16)  # as vLLM's message queues: unlinked on SIGTERM

    def shut_down(*_: object) -> None:
        engine.kill()
        engine.wait()
        segment.close()
        segment.unlink()
        sys.exit(0)

    signal.signal(signal.SIGTERM, shut_down)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
