"""The search service behind the HTTP app: normalise, cache lookup, provider call, cache write.

An answer is a function of the query and the provider, never of what the service answered before. The
provider answers the normalised query, which is also the exact cache key, so an exact hit returns what a
miss would have, whichever spelling of the query came first (called with the raw text, the first spelling's
results were cached for all of them). Cache entries live under the provider's `scope`: the local index's
fingerprint (a rebuilt index with other passages starts with an empty cache, not the old index's answers)
or the API's endpoint. The fuzzy cache is the one deliberate exception: a fuzzy hit answers with a similar
query's cached results, so answers then depend on which similar query came first; it is off by default
(`search.fuzzy`) and meant for paid APIs, where a call saved is money saved.

The provider is chosen once from `SearchConfig.provider` (`make_provider`), never by string checks per
request. The local BM25 search is CPU work and runs in a worker thread so the event loop keeps
answering cache hits. Every provider call has a deadline (timeout x attempts), so nothing hangs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.config.search import SearchConfig
from sandbox.search.bm25 import BM25Index, index_fingerprint
from sandbox.search.cache import CacheOutcome, SearchCache
from sandbox.search.normalize import normalize_query
from sandbox.search.results import Passage
from sandbox.search.serper import ProviderError, SerperClient


log = logging.getLogger(__name__)


class SearchProvider(Protocol):
    name: str
    scope: str  # what its answers are a function of (no ":"): the cache keeps entries per scope

    async def search(self, query: str, k: int) -> list[Passage]: ...

    async def aclose(self) -> None: ...


class LocalBM25Provider:
    name = "local-bm25"

    def __init__(self, index: BM25Index, fingerprint: str) -> None:
        self.index = index
        self.scope = f"{self.name}@{fingerprint}"

    async def search(self, query: str, k: int) -> list[Passage]:
        return await asyncio.to_thread(self.index.search, query, k)

    async def aclose(self) -> None:
        return None


class SerperProvider:
    name = "serper"

    def __init__(self, client: SerperClient, endpoint: str) -> None:
        self.client = client
        self.scope = f"{self.name}@{hashlib.sha256(endpoint.encode()).hexdigest()[:16]}"

    async def search(self, query: str, k: int) -> list[Passage]:
        return await self.client.search(query, k)

    async def aclose(self) -> None:
        await self.client.aclose()


def make_provider(cfg: SearchConfig, root: Path) -> SearchProvider:
    """The configured provider; raises with a clear message when its index or key is missing."""
    if cfg.provider == "local-bm25":
        index_dir = Path(cfg.index_dir) if Path(cfg.index_dir).is_absolute() else root / cfg.index_dir
        return LocalBM25Provider(BM25Index.load(index_dir), index_fingerprint(index_dir))
    api_key = os.environ.get(cfg.serper_api_key_env, "")
    if not api_key:
        raise ValueError(f"search.provider is 'serper' but ${cfg.serper_api_key_env} is not set")
    return SerperProvider(SerperClient(cfg.serper_url, api_key, rate_per_s=cfg.serper_rate_per_s,
                                      timeout_s=cfg.provider_timeout_s, retries=cfg.provider_retries),
                          cfg.serper_url)


@dataclass(frozen=True)
class SearchOutcome:
    query: str
    results: tuple[Passage, ...]
    cache: CacheOutcome
    provider: str
    duration_ms: float


@dataclass
class EngineCounters:
    provider_calls: int = 0
    provider_errors: int = 0


class SearchService:
    def __init__(self, provider: SearchProvider, cache: SearchCache, *, deadline_s: float) -> None:
        self.provider = provider
        self.cache = cache
        self.deadline_s = deadline_s
        self.counters = EngineCounters()
        self._in_flight: dict[tuple[str, int], asyncio.Future[tuple[Passage, ...]]] = {}
        if cache.fuzzy:
            log.warning("search.fuzzy is on: a fuzzy hit answers with a similar query's cached results, so an "
                        "answer depends on which similar query came first (runs are not reproducible)")

    async def search(self, query: str, top_k: int) -> SearchOutcome:
        """Cached results for `query`; raises ProviderError when the provider fails on a cache miss."""
        started = time.perf_counter()
        normalized = normalize_query(query)
        hit = await self.cache.get(self.provider.scope, top_k, normalized)
        if hit.results is not None:
            results = hit.results
        else:
            results = await self._single_flight(top_k, normalized)
        duration_ms = (time.perf_counter() - started) * 1000.0
        return SearchOutcome(query, results, hit.outcome, self.provider.name, duration_ms)

    async def _single_flight(self, top_k: int, normalized: str) -> tuple[Passage, ...]:
        """One provider call per distinct (normalised query, top_k) in flight: a rollout group often
        sends the same query several times at once."""
        key = (normalized, top_k)
        pending = self._in_flight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch_and_store(top_k, normalized))
            self._in_flight[key] = pending
            pending.add_done_callback(lambda _: self._in_flight.pop(key, None))
        return await asyncio.shield(pending)

    async def _fetch_and_store(self, top_k: int, normalized: str) -> tuple[Passage, ...]:
        results = tuple(await self._call_provider(normalized, top_k))  # the key's text: a hit equals a miss
        await self.cache.put(self.provider.scope, top_k, normalized, results)
        return results

    async def _call_provider(self, query: str, top_k: int) -> list[Passage]:
        self.counters.provider_calls += 1
        try:
            return await asyncio.wait_for(self.provider.search(query, top_k), self.deadline_s)
        except TimeoutError:
            self.counters.provider_errors += 1
            raise ProviderError(f"{self.provider.name} gave no answer within {self.deadline_s:.1f}s",
                               unavailable=True) from None
        except ProviderError:
            self.counters.provider_errors += 1
            raise
        except Exception as err:  # a broken index or parser: report it as a bad provider answer (502)
            self.counters.provider_errors += 1
            raise ProviderError(f"{self.provider.name} failed: {type(err).__name__}: {err}", unavailable=False) from err

    def stats(self) -> dict[str, object]:
        c = self.cache.counters
        return {
            "provider": self.provider.name,
            "scope": self.provider.scope,
            "fuzzy": self.cache.fuzzy,
            "cache": "on" if self.cache.online else "off",
            "exact_hits": c.exact_hits,
            "fuzzy_hits": c.fuzzy_hits,
            "misses": c.misses,
            "uncached": c.off,
            "provider_calls": self.counters.provider_calls,
            "provider_errors": self.counters.provider_errors,
            "cache_size": self.cache.size(),
            "index_loading": self.cache.loading,
        }

    async def aclose(self) -> None:
        await self.provider.aclose()
        await self.cache.aclose()
