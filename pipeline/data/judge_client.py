"""A minimal async client of OpenAI-compatible chat completions, with retries and back-off.

We speak the wire format directly with httpx rather than through the `openai` SDK: the SDK's
own retry loop and types would hide the request count and usage we account for, and every
OpenAI-compatible server (vLLM, SGLang, DeepSeek, Gemini's compatibility layer) accepts this
subset: `model`, `messages`, `tools`, `tool_choice`, `temperature`, `max_tokens`.

Retries: connection errors, timeouts and HTTP 408/409/429/5xx are retried `max_retries`
times with exponential back-off starting at `backoff_s` (a `Retry-After` header, if larger
and at most a minute, wins), all within `deadline_s` for the whole call. A connection gets
`connect_timeout_s`, a response `timeout_s` (httpx's read timeout: the longest silence).

Failures are typed by whose fault they are, so curation never rejects a row for an outage:
- `JudgeUnavailable`: the endpoint cannot be used (unreachable, 5xx/429/timeouts after the
  retries, past the deadline, a malformed answer, 401/403/404: a key or URL that is wrong);
  the stage fails, naming the judge.
- `JudgeRefused`: 400/413/422, the request was refused for what it holds (e.g. a question
  over the context length); that row alone is affected.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import httpx

from pipeline.config.curate import JudgeConfig

RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class JudgeError(RuntimeError):
    """A judge request that failed for good (after retries, or a non-retryable status)."""


class JudgeUnavailable(JudgeError):
    """The judge endpoint cannot answer (an outage or a configuration error): no row may be judged by it."""


class JudgeRefused(JudgeError):
    """The endpoint refused this request for its content (HTTP 400/413/422)."""


REFUSED_STATUS = frozenset({400, 413, 422})


@dataclass(frozen=True)
class ChatReply:
    message: dict[str, Any]  # choices[0].message as sent by the server
    prompt_tokens: int
    completion_tokens: int
    attempts: int


class ChatClient:
    """One judge endpoint. `complete()` returns the first choice's message and its usage."""

    def __init__(self, judge: JudgeConfig, *, timeout_s: float, max_retries: int, backoff_s: float,
                 connect_timeout_s: float = 10.0, deadline_s: float | None = None) -> None:
        self.judge = judge
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.deadline_s = deadline_s
        headers = {"Content-Type": "application/json"}
        if judge.api_key_env:
            key = os.environ.get(judge.api_key_env)
            if not key:
                raise JudgeError(f"judge {judge.name!r}: environment variable {judge.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        self._url = judge.base_url.rstrip("/") + "/chat/completions"
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))
        self.requests = 0  # HTTP requests actually sent, retries included

    async def complete(self, body: dict[str, Any]) -> ChatReply:
        """The first choice's message; raises `JudgeUnavailable` or `JudgeRefused` (see the module)."""
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._complete({"model": self.judge.model, **body})
        except TimeoutError:
            raise JudgeUnavailable(f"judge {self.judge.name!r} at {self.judge.base_url}: no answer within the "
                                   f"deadline of {self.deadline_s:g}s (retries included)") from None

    async def _complete(self, body: dict[str, Any]) -> ChatReply:
        last_error = "no attempt made"
        for attempt in range(self.max_retries + 1):
            try:
                self.requests += 1
                response = await self._http.post(self._url, json=body)
            except httpx.HTTPError as err:
                last_error = f"{type(err).__name__}: {err}"
                await self._sleep(attempt, None)
                continue
            if response.status_code in RETRYABLE_STATUS:
                last_error = f"HTTP {response.status_code}"
                await self._sleep(attempt, response.headers.get("retry-after"))
                continue
            if response.status_code in REFUSED_STATUS:
                raise JudgeRefused(f"judge {self.judge.name!r}: HTTP {response.status_code}: {response.text[:300]}")
            if response.status_code != 200:
                raise JudgeUnavailable(f"judge {self.judge.name!r} at {self.judge.base_url}: HTTP "
                                       f"{response.status_code}: {response.text[:300]}")
            return self._parse(response, attempt + 1)
        raise JudgeUnavailable(f"judge {self.judge.name!r} at {self.judge.base_url}: unreachable, gave up after "
                               f"{self.max_retries + 1} attempts ({last_error})")

    async def _sleep(self, attempt: int, retry_after: str | None) -> None:
        if attempt >= self.max_retries:
            return
        delay = self.backoff_s * 2**attempt
        try:
            delay = max(delay, min(float(retry_after), 60.0)) if retry_after else delay
        except ValueError:
            pass  # an HTTP-date Retry-After: keep our own back-off
        await asyncio.sleep(delay)

    def _parse(self, response: httpx.Response, attempts: int) -> ChatReply:
        try:
            data = response.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise JudgeUnavailable(f"judge {self.judge.name!r}: malformed completion ({err!r}): {response.text[:300]}") from None
        usage = data.get("usage") or {}
        return ChatReply(message, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), attempts)

    async def aclose(self) -> None:
        await self._http.aclose()
