"""Async client for the code sandbox (`POST /run`), as a `Tool` for the rollout engine.

What the model sees (`ToolResult.output`) follows ToRL: the snippet's stdout, and when it
failed, the last traceback line after it (`"...\\nZeroDivisionError: division by zero"`).
`ok` is True only for status "ok"; `status` is the service's verdict, or "unavailable"
when the service could not be reached, answered 5xx/429 after the retries, answered garbage or
not within the client's timeout: those are infrastructure failures (`ToolResult.infrastructure`),
counted in `counts`, never the policy's. A snippet that ran past its own limit is the sandbox's
verdict "timeout", the policy's. Empty stdout on success stays empty: the rollout engine decides
how to word it.

Seeded (`seed`, params `sandbox.seed`): every snippet's random generators (random, numpy's global one,
sympy's) start from a seed made of the client's seed and the code (`snippet_seed`), and the object addresses
that default reprs print (`<generator object <genexpr> at 0x7f...>`, a small policy's common mistake) are
numbered canonically (`canonical_addresses`): the worker's memory layout is randomised, and keeping it so is
worth more than repeating an address. So a run's code answers repeat in the next run; SandboxFusion and TAPO's
sandbox give fresh randomness and real addresses instead (`sandbox.seed: null`).

Retries: connection failures and 429/502/503/504 are retried (with the server's
Retry-After, else exponential backoff) up to `retries` times; a snippet that ran is never
re-run. A refused connection is also retried for up to `recover_s` seconds (the time the
services flow needs to restart a sandbox that died), so a restart costs a wait, not outages. A semaphore bounds requests in flight so a large batch queues here, not in the
server's bounded queue.

Bounds (`pipeline.tools.base`): a call that holds a slot has `deadline_s` for all of it (retries and the wait for
a restarting sandbox included); no complete answer by then is an outage (a hung or dripping sandbox). An answer
over `max_answer_bytes` is not read: it can only be the snippet's output (the sandbox caps it itself, at 64 KiB
a stream by default), so it is the sandbox's own verdict on a print loop, status "output_limit", the policy's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import replace

import httpx

from pipeline.config.sandbox import SandboxConfig
from pipeline.tools.base import (AnswerTooLarge, CallCounts, CallLimits, infrastructure_status, json_body,
                                 missed_deadline, post_with_retries, response_detail)
from pipeline.types import ToolName, ToolResult

_RETRYABLE_STATUS = {429, 502, 503, 504}  # not a 500: the snippet may have run (a re-run would repeat its effects)
# The server answers within timeout_s plus its own start-up and queueing; this is our margin.
_HTTP_MARGIN_S = 10.0


def model_output(stdout: str, error: str | None) -> str:
    """ToRL-style feedback: stdout, then the last traceback line on failure."""
    if not error:
        return stdout
    if not stdout:
        return error
    return stdout + ("" if stdout.endswith("\n") else "\n") + error


class CodeSandboxClient:
    name: ToolName = "code"

    def __init__(self, url: str, *, timeout_s: float = 5.0, memory_mb: int = 512, concurrency: int = 8,
                 retries: int = 2, recover_s: float = 0.0, seed: int | None = None, deadline_s: float = 60.0,
                 max_answer_bytes: int = 1 << 20) -> None:
        if not url:
            raise ValueError("CodeSandboxClient needs the sandbox URL (e.g. http://127.0.0.1:PORT)")
        if (concurrency < 1 or retries < 0 or timeout_s <= 0 or memory_mb <= 0 or recover_s < 0
                or deadline_s <= timeout_s):
            raise ValueError(f"bad client limits: concurrency={concurrency} retries={retries} "
                             f"timeout_s={timeout_s} memory_mb={memory_mb} deadline_s={deadline_s} (over timeout_s)")
        self.limits = CallLimits(deadline_s, max_answer_bytes)
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.retries = retries
        self.recover_s = recover_s
        self.seed = seed
        self._slots = asyncio.Semaphore(concurrency)
        self.counts = CallCounts()
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s + _HTTP_MARGIN_S, connect=5.0),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )

    @classmethod
    def from_config(cls, cfg: SandboxConfig, url: str) -> CodeSandboxClient:
        return cls(url, timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb, concurrency=cfg.concurrency,
                   retries=cfg.retries, recover_s=cfg.recover_s, seed=cfg.seed, deadline_s=cfg.deadline_s,
                   max_answer_bytes=cfg.max_answer_bytes)

    async def __call__(self, call_input: str) -> ToolResult:
        return self.counts.count(await self._run(call_input))

    async def _run(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        request = json_body(self._payload(call_input))
        if not isinstance(request, bytes):  # input no service can be sent: the policy's
            return request
        async with self._slots:
            try:
                async with asyncio.timeout(self.limits.deadline_s):
                    body = _checked_body(await post_with_retries(
                        self._http, f"{self.url}/run", request, retries=self.retries, recover_s=self.recover_s,
                        max_answer_bytes=self.limits.max_answer_bytes, retry_status=_RETRYABLE_STATUS.__contains__))
            except CodeRefused as exc:
                return ToolResult.failure(str(exc), status="rejected", latency_s=time.perf_counter() - started)
            except AnswerTooLarge as exc:  # only the snippet's output can be that long: its print loop
                return ToolResult.failure(f"OutputLimitExceeded: {exc}", status="output_limit",
                                          latency_s=time.perf_counter() - started)
            except TimeoutError:  # the whole call's deadline: a hung or dripping sandbox
                return replace(missed_deadline("code sandbox", self.limits.deadline_s),
                               latency_s=time.perf_counter() - started)
            except (httpx.HTTPError, OSError, ValueError) as exc:  # unreachable, 5xx, garbage, no answer in time
                return ToolResult.failure(f"code sandbox unavailable: {type(exc).__name__}: {exc}",
                                          status="unavailable", latency_s=time.perf_counter() - started,
                                          infrastructure=True)
        if self.seed is not None:  # one numbering over both fields: an object shown in each keeps one address
            seen: dict[str, str] = {}
            body = body | {key: canonical_addresses(body[key], seen) for key in ("stdout", "error") if body.get(key)}
        return self._to_result(body, time.perf_counter() - started)

    def _payload(self, code: str) -> dict:
        payload = {"code": code, "timeout_s": self.timeout_s, "memory_mb": self.memory_mb}
        if self.seed is not None:
            payload["seed"] = snippet_seed(self.seed, code)
        return payload

    @staticmethod
    def _to_result(body: dict, latency_s: float) -> ToolResult:
        status = body["status"]
        error = body.get("error")
        return ToolResult(output=model_output(body.get("stdout", ""), error), ok=status == "ok", status=status,
                          error=error, latency_s=latency_s)

    async def aclose(self) -> None:
        await self._http.aclose()


_ADDRESS = re.compile(r"(?<= at )0x[0-9a-f]{6,16}(?=>)")  # default reprs: <generator object f at 0x7f...>


def canonical_addresses(text: str, seen: dict[str, str] | None = None) -> str:
    """`text` with each memory address of an object's default repr replaced by a canonical one, numbered in order of
    first appearance (one object, one address; two objects, two): addresses come from the sandbox worker's
    randomised memory layout, so `print(x for x in xs)` printed another text in every run. `seen` carries the
    numbering on from an earlier text of the same answer."""
    seen = {} if seen is None else seen
    return _ADDRESS.sub(lambda m: seen.setdefault(m.group(), f"0x{0x7F0000000000 + 16 * len(seen):x}"), text)


def snippet_seed(seed: int, code: str) -> int:
    """The seed of one snippet's random generators: a function of the client's seed and the code alone, so a
    call prints the same thing in every run, whichever worker runs it and whatever ran before."""
    digest = hashlib.sha256(f"{seed}\0{code}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "little")


class CodeRefused(Exception):
    """A 4xx other than 429 (413: the snippet is over the server's size limit): the request, not the
    service, is at fault, and retrying cannot help."""


CodeTooLarge = CodeRefused  # the name earlier callers used for the 413 case


def _checked_body(response: httpx.Response) -> dict:
    if response.status_code == 413:
        raise CodeRefused(f"code rejected by the sandbox: {response_detail(response, 200) or 'too large'}")
    if response.status_code != 200 and not infrastructure_status(response.status_code):
        raise CodeRefused(f"code rejected by the sandbox: HTTP {response.status_code} {response_detail(response, 200)}")
    if response.status_code != 200:
        raise ValueError(f"HTTP {response.status_code} from the sandbox: {response.text[:200]}")
    try:
        body = response.json()
    except RecursionError:
        raise ValueError("malformed sandbox answer: nested too deeply") from None
    if (not isinstance(body, dict) or not isinstance(body.get("status"), str)
            or not isinstance(body.get("stdout", ""), str) or not isinstance(body.get("error") or "", str)):
        raise ValueError(f"malformed sandbox answer: {str(body)[:200]}")
    return body
