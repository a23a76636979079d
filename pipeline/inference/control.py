"""vLLM's RL control plane over HTTP, one bounded call each: pause, resume, the weight version, collective_rpc, the
NCCL weight-transfer routes. Synchronous: the trainer (and a server's keeper thread) calls them, never the rollout's
event loop.

Behind `VLLM_SERVER_DEV_MODE=1` vLLM serves `/pause?mode=keep` (requests in flight keep their tokens and continue
after `/resume`), `/update_weight_version` (the label the next tokens' `weight_versions` spans carry), and
`/collective_rpc` (a method of the worker extension on every worker, string arguments only). A call that fails is a
`ServerCallError` naming the server, the route and what it answered; one that the server did not answer at all (no
connection, dropped, past its deadline) is a `ServerUnreachable`, which the caller treats as a dead server.
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class ServerCallError(RuntimeError):
    """A control call that the server answered with an error."""


class ServerUnreachable(ServerCallError):
    """A control call that got no answer: no connection, a dropped one, or none within the deadline."""


def call(url: str, route: str, deadline_s: float, *, body: Any = None, params: dict[str, str] | None = None,
         method: str = "POST") -> Any:
    """One control call; its JSON answer (None for an empty one). A new connection each time: after a failed
    collective_rpc vLLM closes the connection, and a pooled one would fail the next call."""
    try:
        with httpx.Client(timeout=httpx.Timeout(deadline_s, connect=min(deadline_s, 10.0))) as http:
            response = http.request(method, url + route, json=body, params=params)
    except (httpx.TransportError, OSError) as err:
        raise ServerUnreachable(f"{url}{route}: no answer ({type(err).__name__}: {err})") from err
    if response.status_code != 200:
        raise ServerCallError(f"{url}{route}: HTTP {response.status_code} {response.text[:500]}")
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError as err:
        raise ServerCallError(f"{url}{route}: an answer that is not JSON: {response.text[:200]!r}") from err


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(url + "/health", timeout=timeout_s).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def pause(url: str, deadline_s: float) -> None:
    """Requests in flight are frozen with their tokens (mode keep) and continue after `resume`."""
    call(url, "/pause", deadline_s, params={"mode": "keep"})


def resume(url: str, deadline_s: float) -> None:
    call(url, "/resume", deadline_s)


def set_version(url: str, version: int, deadline_s: float) -> None:
    call(url, "/update_weight_version", deadline_s, body={"new_version": str(version)})


def weight_version(url: str, deadline_s: float) -> str:
    return str(call(url, "/weight_info", deadline_s, method="GET")["weight_version"])


def collective_rpc(url: str, method: str, args: list[str], deadline_s: float) -> list[Any]:
    """`method` of the worker extension on every worker of the server; one result per worker."""
    answer = call(url, "/collective_rpc", deadline_s, body={"method": method, "args": args, "timeout": deadline_s})
    results = (answer or {}).get("results")
    if not isinstance(results, list) or not results:
        raise ServerCallError(f"{url}/collective_rpc {method}: no results in {json.dumps(answer)[:200]}")
    return results


def world_size(url: str, deadline_s: float) -> int:
    """The server's workers (tensor x pipeline x data parallel): its ranks in an NCCL weight-transfer group."""
    return int(call(url, "/get_world_size", deadline_s, method="GET")["world_size"])


class WeightsRefused(ServerCallError):
    """The server's receiver refused a weights file before touching its model (not the checkpoint's layout, not the
    version asked for): the server is fine, the push is wrong."""


def load_file(url: str, path: str, version: int, deadline_s: float) -> int:
    """Have every worker of the server load the safetensors file at `path` (version `version`); the tensors loaded.
    A refusal is `WeightsRefused`; any other failure means the reload broke inside the server."""
    results = collective_rpc(url, "tapo_load_file", [path, str(version)], deadline_s)
    for result in results:
        if not isinstance(result, dict) or "loaded" not in result:
            raise ServerCallError(f"{url}: tapo_load_file answered {str(result)[:200]!r}")
        if result.get("refused"):
            raise WeightsRefused(f"{url} refused the weights: {result['refused']}")
    return int(results[0]["loaded"])
