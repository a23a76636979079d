"""The shape of a tool, as the rollout engine sees it, and what every client counts.

A tool is an async callable from the model's call input (code, a search query, or a user tool's arguments
as a JSON object) to a `ToolResult`, with the schema a chat template declares it by (`spec`). Implementations must not raise: timeouts, connection errors and bad
responses become `ToolResult.failure(...)` so one broken call never kills a batch.

A failure is classified once, where it happens, in the client: an *infrastructure* failure
(the service refused the connection, answered 5xx or 429 after the retries, answered garbage,
or did not answer within the call's deadline) is the service's fault and is marked
`ToolResult.infrastructure`; a failure the policy caused (its code raised, ran past the
snippet's limit, its query was refused as too long) is an observation to learn from.

Every call is bounded (docs/tools.md, "Deadlines and bounded answers"): a wall-clock deadline for the whole
call (retries, back-off and waiting for a restarting service included) and a byte limit on the answer, enforced
while it is read (`post_or_outage` streams the body and stops at the limit). A call past its deadline is the
tool's failure, an outage; an answer over the limit is cut unread (status "too_large", or the sandbox's own
"output_limit" for code) and is not an outage: its size answers the call's arguments, which the policy chose, and
the policy must not be able to trip the outage limits by asking for a large answer.

What a client sends is checked here, once for all of them (`json_body`, `parse_arguments`): input that is not
valid Unicode (a lone surrogate), not JSON, holds NaN, or nests too deeply is refused as the policy's error
(status "rejected") before any service sees it; before, httpx raised on it (the search and HTTP clients raised,
the code client reported an outage: a failure the policy could cause on purpose). And what every client returns
passes `CallCounts.count`, which makes its text valid Unicode.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class CallLimits:
    """The bounds of one call: `deadline_s` for all of it, `max_answer_bytes` for the answer (as sent, read)."""

    deadline_s: float
    max_answer_bytes: int

    def __post_init__(self) -> None:
        if not (self.deadline_s > 0 and self.max_answer_bytes > 0):
            raise ValueError(f"bad call limits: {self}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """`text` with each lone surrogate (which no encoder or tokenizer takes) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


@dataclass
class CallCounts:
    """Calls one client made, and how many of them failed, and how many of those for infrastructure.

    Counted per client over its life (the run); the trainer's outage check reads the same fact from
    each trajectory's results, per step. Every client's results pass `count`, which also makes their text
    valid Unicode (a tool may answer lone surrogates; the renderer must never see one)."""

    calls: int = 0
    failed: int = 0
    infrastructure: int = 0
    last_infrastructure_error: str = ""

    def count(self, result: ToolResult) -> ToolResult:
        result = replace(result, output=valid_text(result.output),
                         error=None if result.error is None else valid_text(result.error))
        self.calls += 1
        self.failed += not result.ok
        if result.infrastructure:
            self.infrastructure += 1
            self.last_infrastructure_error = result.error or result.output
        return result


def refused(why: str) -> ToolResult:
    """The policy's call input that no tool is asked with: its fault, never an outage."""
    return ToolResult.failure(f"call refused: its input {why}", status="rejected")


def json_body(payload: Any) -> bytes | ToolResult:
    """`payload` as a UTF-8 JSON request body, or the policy's refusal when it cannot be one."""
    try:
        return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError as err:
        return refused(f"is not valid Unicode (a lone surrogate at character {err.start})")
    except RecursionError:
        return refused("nests too deeply")
    except ValueError:
        return refused("holds NaN or an infinity, which JSON cannot carry")


@dataclass(frozen=True)
class Arguments:
    """A user tool's call arguments: the object, and its JSON request body."""

    values: dict[str, Any]
    body: bytes


def parse_arguments(call_input: str) -> Arguments | ToolResult:
    """The call's arguments (a JSON object of valid Unicode), or the policy's refusal."""
    try:
        values = json.loads(call_input)
    except (ValueError, RecursionError):
        return refused("is not a JSON object")
    if not isinstance(values, dict):
        return refused("is not a JSON object")
    body = json_body(values)
    return body if isinstance(body, ToolResult) else Arguments(values, body)


class AnswerTooLarge(Exception):
    """An answer longer than the call's limit; it was not read past the limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the answer was over {limit} bytes (max_answer_bytes); it was not read")
        self.limit = limit


class UnreadableAnswer(ValueError):
    """An answer in a content encoding we did not ask for: garbage, as far as the client goes."""


def too_large(service: str, err: AnswerTooLarge) -> ToolResult:
    return ToolResult.failure(f"{service}: {err}", status="too_large")


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    """The body of a streamed `response`, refused (`AnswerTooLarge`) as soon as it passes `limit` bytes: a
    Content-Length over the limit before reading, and a body without one once the bytes read pass it."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # asked for identity: decoding a bomb would escape the limit
        raise UnreadableAnswer(f"the answer came in Content-Encoding {encoding!r}, not the identity asked for")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(limit)
    chunks, size = [], 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


_REQUEST_HEADERS = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
_BODY_HEADERS = {"content-encoding", "content-length", "transfer-encoding"}  # describe the wire, not `content`


async def bounded_post(http: httpx.AsyncClient, url: str, body: bytes, max_answer_bytes: int) -> httpx.Response:
    """One POST whose answer is read up to `max_answer_bytes`: a response holding the bytes read."""
    request = http.build_request("POST", url, content=body, headers=_REQUEST_HEADERS)
    response = await http.send(request, stream=True)
    try:
        content = await read_bounded(response, max_answer_bytes)
    finally:
        await response.aclose()
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _BODY_HEADERS]
    return httpx.Response(response.status_code, headers=headers, content=content, request=request)


class Recovery:
    """Waits out a service being restarted: a POST whose connection is refused is sent again, with a
    back-off of at most a second, until `recover_s` seconds after the first refusal; then the refusal is
    raised (and the caller's own retries or outage accounting take over). `recover_s` 0: no waiting."""

    def __init__(self, recover_s: float) -> None:
        self.recover_s = recover_s
        self._refused_since: float | None = None

    async def post(self, http: httpx.AsyncClient, url: str, body: bytes, max_answer_bytes: int) -> httpx.Response:
        wait = 0.1
        while True:
            try:
                return await bounded_post(http, url, body, max_answer_bytes)
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


async def post_with_retries(http: httpx.AsyncClient, url: str, body: bytes, *, retries: int, max_answer_bytes: int,
                            recover_s: float = 0.0,
                            retry_status: Callable[[int], bool] = infrastructure_status) -> httpx.Response:
    """POST `body` (JSON, `json_body`) to a service, as every HTTP client here does: a connection that is
    refused (waited out for `recover_s` first, `Recovery`), dropped or broken, and an answer whose status
    `retry_status` accepts, are tried again up to `retries` times, after the server's Retry-After or a back-off.
    Never retried: a timeout (asking again would wait as long again), an answer over `max_answer_bytes`
    (`AnswerTooLarge`) and any other answer (the request's own fault, or a result). Returns the last answer;
    raises the last transport error (or the timeout). The caller bounds the whole of it by its deadline."""
    recovering = Recovery(recover_s)
    for attempt in range(retries + 1):
        last_try = attempt == retries
        try:
            response = await recovering.post(http, url, body, max_answer_bytes)
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


def missed_deadline(service: str, deadline_s: float) -> ToolResult:
    return outage(service, f"no complete answer within the call's deadline of {deadline_s:g}s")


async def post_or_outage(http: httpx.AsyncClient, url: str, body: bytes, *, service: str, retries: int,
                         limits: CallLimits, recover_s: float = 0.0) -> httpx.Response | ToolResult:
    """`post_with_retries` within `limits.deadline_s`, with what the retries could not get as `service`'s outage:
    no connection, no complete answer in time (a silent, slow or dripping service), an unreadable or a 429/5xx
    answer; an answer over `limits.max_answer_bytes` is cut unread (`too_large`, not an outage). Any other answer
    is returned for the client to read."""
    try:
        async with asyncio.timeout(limits.deadline_s):
            response = await post_with_retries(http, url, body, retries=retries, recover_s=recover_s,
                                               max_answer_bytes=limits.max_answer_bytes)
    except TimeoutError:
        return missed_deadline(service, limits.deadline_s)
    except httpx.TimeoutException as err:
        return outage(service, f"{type(err).__name__}: no answer in {http.timeout.read}s")
    except AnswerTooLarge as err:
        return too_large(service, err)
    except (httpx.HTTPError, OSError, UnreadableAnswer) as err:
        return outage(service, f"{type(err).__name__}: {err}")
    if infrastructure_status(response.status_code):
        return outage(service, f"HTTP {response.status_code} {response_detail(response)}".rstrip())
    return response


def response_detail(response: httpx.Response, limit: int = 300) -> str:
    """What an error answer says: FastAPI's `detail`, else the start of its text."""
    try:
        return str(response.json().get("detail", ""))[:limit]
    except (ValueError, AttributeError, RecursionError):
        return response.text[:limit]
