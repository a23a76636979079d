"""The shape of a tool, as the rollout engine sees it, and what every client counts.

A tool is an async callable from the model's call input (code, a search query, or a user tool's arguments
as a JSON object) to a `ToolResult`, with the schema a chat template declares it by (`spec`). Implementations must not raise: timeouts, connection errors and bad
responses become `ToolResult.failure(...)` so one broken call never kills a batch.

A failure is classified once, where it happens, in the client: an *infrastructure* failure
(the service refused the connection, answered 5xx or 429 after the retries, answered garbage,
or did not answer within the client's timeout) is the service's fault and is marked
`ToolResult.infrastructure`; a failure the policy caused (its code raised, ran past the
snippet's limit, its query was refused as too long) is an observation to learn from.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx

from pipeline.types import BUILTIN_SPECS, ToolName, ToolResult, ToolSpec


@runtime_checkable
class Tool(Protocol):
    name: ToolName

    async def __call__(self, call_input: str) -> ToolResult: ...

    async def aclose(self) -> None: ...


def tool_specs(tools: Mapping[ToolName, Tool]) -> dict[ToolName, ToolSpec]:
    """Each tool's schema: its own `spec`, else the built-in one of its name (code, search)."""
    specs = {}
    for name, tool in tools.items():
        spec = getattr(tool, "spec", None) or BUILTIN_SPECS.get(name)
        if spec is None:
            raise ValueError(f"tool {name!r} has no schema: give it a `spec` (pipeline.types.ToolSpec)")
        specs[name] = spec
    return specs


def infrastructure_status(status_code: int) -> bool:
    """An HTTP status that says the service (not the request) failed: 429 (still overloaded after our
    retries) and every 5xx."""
    return status_code == 429 or status_code >= 500


@dataclass
class CallCounts:
    """Calls one client made, and how many of them failed, and how many of those for infrastructure.

    Counted per client over its life (the run); the trainer's outage check reads the same fact from
    each trajectory's results, per step."""

    calls: int = 0
    failed: int = 0
    infrastructure: int = 0
    last_infrastructure_error: str = ""

    def count(self, result: ToolResult) -> ToolResult:
        self.calls += 1
        self.failed += not result.ok
        if result.infrastructure:
            self.infrastructure += 1
            self.last_infrastructure_error = result.error or result.output
        return result


class Recovery:
    """Waits out a service being restarted: a POST whose connection is refused is sent again, with a
    back-off of at most a second, until `recover_s` seconds after the first refusal; then the refusal is
    raised (and the caller's own retries or outage accounting take over). `recover_s` 0: no waiting."""

    def __init__(self, recover_s: float) -> None:
        self.recover_s = recover_s
        self._refused_since: float | None = None

    async def post(self, http: httpx.AsyncClient, url: str, payload: Any) -> httpx.Response:
        wait = 0.1
        while True:
            try:
                return await http.post(url, json=payload)
            except httpx.ConnectError:
                now = time.monotonic()
                self._refused_since = self._refused_since or now
                if now - self._refused_since + wait > self.recover_s:
                    raise
                await asyncio.sleep(wait)
                wait = min(2 * wait, 1.0)


BACKOFF_CAP_S = 2.0
RETRY_AFTER_CAP_S = 10.0


def retry_delay(response: httpx.Response | None, attempt: int) -> float:
    """The server's Retry-After in seconds (capped), else an exponential back-off from 0.2 s (capped). A value
    that is no such number (an HTTP date, nan, a negative) gets the back-off: a service, or a user's endpoint,
    must not be able to turn the retries into a burst."""
    if response is not None:
        try:
            asked = float(response.headers.get("Retry-After", ""))
        except ValueError:
            asked = math.nan
        if 0 <= asked:  # False for nan
            return min(asked, RETRY_AFTER_CAP_S)
    return min(0.2 * 2**attempt, BACKOFF_CAP_S)


async def post_with_retries(http: httpx.AsyncClient, url: str, payload: Any, *, retries: int,
                            recover_s: float = 0.0,
                            retry_status: Callable[[int], bool] = infrastructure_status) -> httpx.Response:
    """POST `payload` to a service, as every HTTP client here does: a connection that is refused (waited out for
    `recover_s` first, `Recovery`), dropped or broken, and an answer whose status `retry_status` accepts, are
    tried again up to `retries` times, after the server's Retry-After or a back-off. Never retried: a timeout
    (asking again would wait as long again) and any other answer (the request's own fault, or a result).
    Returns the last answer; raises the last transport error (or the timeout)."""
    recovering = Recovery(recover_s)
    for attempt in range(retries + 1):
        last_try = attempt == retries
        try:
            response = await recovering.post(http, url, payload)
        except httpx.TimeoutException:
            raise
        except (httpx.TransportError, OSError):
            if last_try:
                raise
            await asyncio.sleep(retry_delay(None, attempt))
            continue
        if retry_status(response.status_code) and not last_try:
            await asyncio.sleep(retry_delay(response, attempt))
            continue
        return response
    raise AssertionError("unreachable: the last attempt returns or raises")


def outage(service: str, detail: str) -> ToolResult:
    return ToolResult.failure(f"{service} unavailable: {detail}", status="unavailable", infrastructure=True)


async def post_or_outage(http: httpx.AsyncClient, url: str, payload: Any, *, service: str, retries: int,
                         recover_s: float = 0.0) -> httpx.Response | ToolResult:
    """`post_with_retries`, with what the retries could not get as `service`'s outage: no connection, no answer
    in time, or a 429/5xx answer. Any other answer is returned for the client to read."""
    try:
        response = await post_with_retries(http, url, payload, retries=retries, recover_s=recover_s)
    except httpx.TimeoutException as err:
        return outage(service, f"{type(err).__name__}: no answer in {http.timeout.read}s")
    except (httpx.HTTPError, OSError) as err:
        return outage(service, f"{type(err).__name__}: {err}")
    if infrastructure_status(response.status_code):
        return outage(service, f"HTTP {response.status_code} {response_detail(response)}".rstrip())
    return response


def response_detail(response: httpx.Response, limit: int = 300) -> str:
    """What an error answer says: FastAPI's `detail`, else the start of its text."""
    try:
        return str(response.json().get("detail", ""))[:limit]
    except (ValueError, AttributeError):
        return response.text[:limit]
