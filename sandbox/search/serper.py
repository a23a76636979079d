"""Serper.dev Google search client: rate-limited, retried, mapped to `Passage` results.

Request: `POST {url}` with header `X-API-KEY` and body `{"q": query, "num": k}` (as TAPO's
`serper_topkcommon.py`). Response mapping, best first: `answerBox` (answer or snippet),
`knowledgeGraph` (description), then `organic` results (snippet); ids are `serper-<rank>` and the
score is 1/rank, since the API returns no relevance score. Its text is cleaned (`clean_text`: a lone
surrogate becomes U+FFFD) and a link that is not a string is dropped. Deviation from TAPO: TAPO formats a string
("Doc 1: (Title: ...)") before caching; we keep structured results and format in the client.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from sandbox.search.results import Passage, clean_text


class ProviderError(Exception):
    """A provider failed after its retries. `unavailable`: could not reach it (HTTP 503), else bad answer (502)."""

    def __init__(self, message: str, *, unavailable: bool) -> None:
        super().__init__(message)
        self.unavailable = unavailable


class RateLimiter:
    """Token bucket: at most `rate_per_s` acquisitions per second on average, bursts up to `burst`."""

    def __init__(self, rate_per_s: float, burst: int = 1) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate_per_s)
            self._last = now
            if self._tokens < 1.0:
                await asyncio.sleep((1.0 - self._tokens) / self.rate_per_s)
                self._tokens = 1.0
                self._last = time.monotonic()
            self._tokens -= 1.0


def map_serper_response(data: dict[str, Any], k: int) -> list[Passage]:
    """Answer box, knowledge graph, then organic results, cut to k."""
    found: list[tuple[str, str, str | None]] = []
    box = data.get("answerBox") or {}
    if isinstance(box, dict) and (box.get("answer") or box.get("snippet")):
        found.append((str(box.get("title", "")), str(box.get("answer") or box.get("snippet")), box.get("link")))
    graph = data.get("knowledgeGraph") or {}
    if isinstance(graph, dict) and graph.get("description"):
        found.append((str(graph.get("title", "")), str(graph["description"]),
                      graph.get("descriptionLink") or graph.get("website")))
    for item in data.get("organic") or []:
        if isinstance(item, dict) and item.get("snippet"):
            found.append((str(item.get("title", "")), str(item["snippet"]), item.get("link")))
    return [Passage(id=f"serper-{rank}", title=clean_text(title), text=clean_text(text),
                    url=clean_text(url) if isinstance(url, str) else None, score=1.0 / rank)
            for rank, (title, text, url) in enumerate(found[:k], 1)]


class SerperClient:
    """Async Serper client. `search` raises ProviderError after `retries` failed attempts."""

    def __init__(self, url: str, api_key: str, *, rate_per_s: float, timeout_s: float, retries: int) -> None:
        self.url = url
        self.retries = retries
        self._limiter = RateLimiter(rate_per_s)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), headers={"X-API-KEY": api_key})

    async def _attempt(self, query: str, k: int) -> list[Passage]:
        await self._limiter.acquire()
        response = await self._http.post(self.url, json={"q": query, "num": k})
        if response.status_code != 200:
            raise ProviderError(f"serper answered HTTP {response.status_code}", unavailable=response.status_code == 429)
        try:
            data = response.json()
        except ValueError:
            raise ProviderError("serper answered non-JSON", unavailable=False) from None
        if not isinstance(data, dict):
            raise ProviderError("serper answered JSON that is not an object", unavailable=False)
        return map_serper_response(data, k)

    async def search(self, query: str, k: int) -> list[Passage]:
        last: ProviderError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            try:
                return await self._attempt(query, k)
            except httpx.HTTPError as err:
                last = ProviderError(f"serper unreachable: {type(err).__name__}", unavailable=True)
            except ProviderError as err:
                last = err
        assert last is not None
        raise last

    async def aclose(self) -> None:
        await self._http.aclose()
