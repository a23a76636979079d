"""The search engine behind the HTTP service: normalise, cache lookup, backend call, cache write.

The backend is chosen once from `SearchConfig.backend` (`make_backend`), never by string checks per
request. The local BM25 search is CPU work and runs in a worker thread so the event loop keeps
answering cache hits. Every backend call has a deadline (timeout x attempts), so nothing hangs.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.config.search import SearchConfig
from sandbox.search.bm25 import BM25Index
from sandbox.search.cache import CacheOutcome, SearchCache
from sandbox.search.normalize import normalize_query
from sandbox.search.results import Passage
from sandbox.search.serper import BackendError, SerperClient


class Backend(Protocol):
    name: str

    async def search(self, query: str, k: int) -> list[Passage]: ...

    async def aclose(self) -> None: ...


class LocalBM25Backend:
    name = "local-bm25"

    def __init__(self, index: BM25Index) -> None:
        self.index = index

    async def search(self, query: str, k: int) -> list[Passage]:
        return await asyncio.to_thread(self.index.search, query, k)

    async def aclose(self) -> None:
        return None


class SerperBackend:
    name = "serper"

    def __init__(self, client: SerperClient) -> None:
        self.client = client

    async def search(self, query: str, k: int) -> list[Passage]:
        return await self.client.search(query, k)

    async def aclose(self) -> None:
        await self.client.aclose()


def make_backend(cfg: SearchConfig, root: Path) -> Backend:
    """The configured backend; raises with a clear message when its index or key is missing."""
    if cfg.backend == "local-bm25":
        index_dir = Path(cfg.index_dir)
        return LocalBM25Backend(BM25Index.load(index_dir if index_dir.is_absolute() else root / index_dir))
    api_key = os.environ.get(cfg.serper_api_key_env, "")
    if not api_key:
        raise ValueError(f"search.backend is 'serper' but ${cfg.serper_api_key_env} is not set")
    return SerperBackend(SerperClient(cfg.serper_url, api_key, rate_per_s=cfg.serper_rate_per_s,
                                      timeout_s=cfg.backend_timeout_s, retries=cfg.backend_retries))


@dataclass(frozen=True)
class SearchOutcome:
    query: str
    results: tuple[Passage, ...]
    cache: CacheOutcome
    backend: str
    duration_ms: float


@dataclass
class EngineCounters:
    backend_calls: int = 0
    backend_errors: int = 0


class SearchEngine:
    def __init__(self, backend: Backend, cache: SearchCache, *, deadline_s: float) -> None:
        self.backend = backend
        self.cache = cache
        self.deadline_s = deadline_s
        self.counters = EngineCounters()
        self._in_flight: dict[tuple[str, int], asyncio.Future[tuple[Passage, ...]]] = {}

    async def search(self, query: str, top_k: int) -> SearchOutcome:
        """Cached results for `query`; raises BackendError when the backend fails on a cache miss."""
        started = time.perf_counter()
        normalized = normalize_query(query)
        hit = await self.cache.get(self.backend.name, top_k, normalized)
        if hit.results is not None:
            results = hit.results
        else:
            results = await self._single_flight(query, top_k, normalized)
        duration_ms = (time.perf_counter() - started) * 1000.0
        return SearchOutcome(query, results, hit.outcome, self.backend.name, duration_ms)

    async def _single_flight(self, query: str, top_k: int, normalized: str) -> tuple[Passage, ...]:
        """One backend call per distinct (normalised query, top_k) in flight: a rollout group often
        sends the same query several times at once."""
        key = (normalized, top_k)
        pending = self._in_flight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch_and_store(query, top_k, normalized))
            self._in_flight[key] = pending
            pending.add_done_callback(lambda _: self._in_flight.pop(key, None))
        return await asyncio.shield(pending)

    async def _fetch_and_store(self, query: str, top_k: int, normalized: str) -> tuple[Passage, ...]:
        results = tuple(await self._call_backend(query, top_k))
        await self.cache.put(self.backend.name, top_k, normalized, results)
        return results

    async def _call_backend(self, query: str, top_k: int) -> list[Passage]:
        self.counters.backend_calls += 1
        try:
            return await asyncio.wait_for(self.backend.search(query, top_k), self.deadline_s)
        except TimeoutError:
            self.counters.backend_errors += 1
            raise BackendError(f"{self.backend.name} gave no answer within {self.deadline_s:.1f}s",
                               unavailable=True) from None
        except BackendError:
            self.counters.backend_errors += 1
            raise
        except Exception as err:  # a broken index or parser: report it as a bad backend answer (502)
            self.counters.backend_errors += 1
            raise BackendError(f"{self.backend.name} failed: {type(err).__name__}: {err}", unavailable=False) from err

    def stats(self) -> dict[str, object]:
        c = self.cache.counters
        return {
            "backend": self.backend.name,
            "cache": "on" if self.cache.online else "off",
            "exact_hits": c.exact_hits,
            "fuzzy_hits": c.fuzzy_hits,
            "misses": c.misses,
            "uncached": c.off,
            "backend_calls": self.counters.backend_calls,
            "backend_errors": self.counters.backend_errors,
            "cache_size": self.cache.size(),
            "index_loading": self.cache.loading,
        }

    async def aclose(self) -> None:
        await self.backend.aclose()
        await self.cache.aclose()
