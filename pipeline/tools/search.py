"""Async client of the search service, as a rollout `Tool`.

`await client(query)` returns a `ToolResult` whose output is what the model reads, formatted like
Search-R1's `_passages2string` / TAPO's Serper formatter: "Doc 1 (Title: ...) text" lines. It never
raises: an unreachable or failing service (after `retries` retries with back-off: refused, 5xx/429,
a malformed answer, or no answer within the client's timeout) gives `ToolResult.failure(...,
status="unavailable", infrastructure=True)`, counted in `counts`; a query the service refuses (empty,
too long) gives status "rejected" without retrying, the policy's doing; no results gives an ok result
saying nothing was found. A refused connection is retried for up to `recover_s` seconds first (a
service the services flow is restarting), so a restart costs a wait, not outages.

Bounds (`pipeline.tools.base`): `deadline_s` for the whole call (retries, back-off and recovery included): no
complete answer by then is an outage; an answer over `max_answer_bytes` is not read (status "too_large", not an
outage). A query that is not valid Unicode is refused here, the policy's error, before the service sees it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx

from pipeline.config.search import SearchConfig
from pipeline.tools.base import CallCounts, CallLimits, json_body, post_or_outage, response_detail
from pipeline.types import ToolResult


def format_results(results: list[dict]) -> str:
    return "\n".join(f"Doc {i} (Title: {r.get('title', '')}) {r.get('text', '')}" for i, r in enumerate(results, 1))


class SearchClient:
    name = "search"

    def __init__(self, url: str, *, top_k: int = 3, timeout_s: float = 10.0, concurrency: int = 8,
                 retries: int = 2, recover_s: float = 0.0, deadline_s: float = 60.0,
                 max_answer_bytes: int = 1 << 20) -> None:
        self.limits = CallLimits(deadline_s, max_answer_bytes)
        self.url = url.rstrip("/")
        self.top_k = top_k
        self.retries = retries
        self.recover_s = recover_s
        self._limit = asyncio.Semaphore(concurrency)
        self.counts = CallCounts()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s))

    @classmethod
    def from_config(cls, cfg: SearchConfig, url: str) -> SearchClient:
        # The service itself retries the provider; the client's timeout covers all of those attempts.
        timeout_s = cfg.provider_timeout_s * (cfg.provider_retries + 1) + 5.0
        return cls(url, top_k=cfg.top_k, timeout_s=timeout_s, retries=2, recover_s=cfg.recover_s,
                   deadline_s=cfg.deadline_s, max_answer_bytes=cfg.max_answer_bytes)

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        query = call_input.strip()
        if not query:
            return self.counts.count(ToolResult.failure("empty search query", status="rejected"))
        async with self._limit:
            result = await self._search_with_retries(query)
        return self.counts.count(dataclasses.replace(result, latency_s=time.perf_counter() - started))

    async def _search_with_retries(self, query: str) -> ToolResult:
        body = json_body({"query": query, "top_k": self.top_k})
        if not isinstance(body, bytes):  # a query no service can be sent: the policy's
            return body
        answer = await post_or_outage(self._http, f"{self.url}/search", body, service="search service",
                                      retries=self.retries, recover_s=self.recover_s, limits=self.limits)
        if isinstance(answer, ToolResult):
            return answer
        if answer.status_code != 200:
            return ToolResult.failure(f"search refused the query: {response_detail(answer)}", status="rejected")
        return _parse(answer)

    async def aclose(self) -> None:
        await self._http.aclose()


def _parse(response: httpx.Response) -> ToolResult:
    try:
        results = response.json()["results"]
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise TypeError(results)
    except (ValueError, KeyError, TypeError, RecursionError):
        return ToolResult.failure("search service sent a malformed answer", status="unavailable", infrastructure=True)
    if not results:
        return ToolResult("No results found.", ok=True)
    return ToolResult(format_results(results), ok=True)
