"""The search cache: exact then guarded fuzzy lookups in Redis, degrading to "off" when Redis is down.

Layout in Redis (all keys under `namespace`, default "tapo:search:v2"), where `scope` names what the
provider's answers are a function of (`local-bm25@<index fingerprint>`, `serper@<endpoint digest>`), so
entries of another index or API are never served:
- `{ns}:r:{sha1(scope, top_k, normalised query)}` -> JSON `{"query", "results"}` with a TTL;
- `{ns}:z:{scope}:{top_k}` sorted set: member = normalised query, score = its expiry time (epoch s).

The sorted set is what makes the fuzzy index survive a restart: after the first successful connect
the live members are loaded into an in-process `FuzzyIndex` per (scope, top_k) (in the background
in the service), and expired ones are pruned. Writes go to Redis and to the local index. Entries written by another service process
are found by the exact lookup at once and by the fuzzy lookup after this process's next reload.

When a Redis call fails (refused, timeout), the cache switches to "off", logs once, and every request
is served uncached; at most once per `retry_s` a request probes Redis with PING and, when it answers,
switches back on (keeping the in-process index). Deviation from TAPO: TAPO caches pickled strings keyed by md5
of the raw query and has no index or outage handling.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sandbox.search.fuzzy import FuzzyIndex
from sandbox.search.results import Passage

log = logging.getLogger(__name__)

RELOAD_PAGE = 5000
CacheOutcome = Literal["exact", "fuzzy", "miss", "off"]


@dataclass(frozen=True)
class CacheHit:
    outcome: CacheOutcome
    results: tuple[Passage, ...] | None = None
    matched_query: str | None = None


@dataclass
class CacheCounters:
    exact_hits: int = 0
    fuzzy_hits: int = 0
    misses: int = 0
    off: int = 0


class SearchCache:
    """Exact + guarded fuzzy cache in Redis. Create, then `await connect()`; never raises on Redis failures."""

    def __init__(self, redis_url: str, *, ttl_s: int, fuzzy_threshold: float, fuzzy: bool = True,
                 namespace: str = "tapo:search:v2", retry_s: float = 1.0, timeout_s: float = 1.0,
                 known_words: frozenset[str] = frozenset()) -> None:
        self.known_words = known_words
        self.ttl_s = ttl_s
        self.fuzzy_threshold = fuzzy_threshold
        self.fuzzy = fuzzy
        self.namespace = namespace
        self.retry_s = retry_s
        self.counters = CacheCounters()
        self._redis = aioredis.from_url(redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                        decode_responses=True) if redis_url else None
        self._indexes: dict[tuple[str, int], FuzzyIndex] = {}
        self._online = False
        self._loaded = False
        self._loader: asyncio.Task[None] | None = None
        self._down_logged = False
        self._next_probe = 0.0

    @property
    def _client(self) -> aioredis.Redis:
        """The connection, once `connect` found Redis (which it only tries with a URL)."""
        assert self._redis is not None
        return self._redis

    @property
    def online(self) -> bool:
        return self._online

    def size(self) -> int:
        return sum(len(index) for index in self._indexes.values())

    def _result_key(self, scope: str, top_k: int, normalized: str) -> str:
        digest = hashlib.sha1(f"{scope}\x00{top_k}\x00{normalized}".encode()).hexdigest()
        return f"{self.namespace}:r:{digest}"

    def _index_key(self, scope: str, top_k: int) -> str:
        if ":" in scope:  # the reload splits the key at its last two colons
            raise ValueError(f"cache scope {scope!r} must not contain ':'")
        return f"{self.namespace}:z:{scope}:{top_k}"

    def _index(self, scope: str, top_k: int) -> FuzzyIndex:
        key = (scope, top_k)
        if key not in self._indexes:
            self._indexes[key] = FuzzyIndex(self.fuzzy_threshold, known_words=self.known_words)
        return self._indexes[key]

    def _went_down(self, err: Exception) -> None:
        if not self._down_logged:  # once per outage, including one that starts before we do
            self._down_logged = True
            log.warning("search cache off: Redis unreachable (%s); serving uncached until it answers", err)
        self._online = False
        self._next_probe = time.monotonic() + self.retry_s

    async def connect(self, load_in_background: bool = False) -> bool:
        """Ping Redis and (once) load the persisted fuzzy index; True when Redis answered.

        With `load_in_background`, the index fills page by page in a task while requests are served:
        exact hits work at once and a fuzzy lookup sees the entries loaded so far (it can miss, never
        merge wrongly), so a service with a million cached queries is healthy in a second.
        """
        if self._redis is None:
            return False
        try:
            await self._redis.ping()
        except (RedisError, OSError) as err:
            self._went_down(err)
            return False
        if not self._online:
            log.info("search cache on")
        self._online = True
        self._down_logged = False
        # Only once: after an outage the local index is still right (entries Redis lost are dropped
        # lazily when their GET comes back empty).
        if not self._loaded:
            self._loaded = True
            if load_in_background:
                self._loader = asyncio.create_task(self._reload())
            else:
                await self._reload()
        return self._online

    @property
    def loading(self) -> bool:
        """True while the persisted index is still being loaded in the background."""
        return self._loader is not None and not self._loader.done()

    async def wait_loaded(self) -> None:
        if self._loader is not None:
            await self._loader

    async def _reload(self) -> None:
        try:
            count = 0
            async for key in self._client.scan_iter(match=f"{self.namespace}:z:*", count=1000):
                count += await self._load_index(key)
            log.info("search cache index loaded: %d cached queries", count)
        except (RedisError, OSError) as err:
            self._loaded = False  # try again on the next connect
            self._went_down(err)

    async def _load_index(self, key: str) -> int:
        scope, top_k = key.rsplit(":", 2)[-2:]
        await self._client.zremrangebyscore(key, "-inf", time.time())
        index = self._index(scope, int(top_k))
        start = 0
        while members := await self._client.zrange(key, start, start + RELOAD_PAGE - 1):
            for member in members:  # paged, so no reply outlasts the socket timeout and requests interleave
                index.add(_text(member))
            start += len(members)
            await asyncio.sleep(0)
        return start

    async def _available(self) -> bool:
        if self._online:
            return True
        if self._redis is None or time.monotonic() < self._next_probe:
            return False
        return await self.connect()

    async def get(self, scope: str, top_k: int, normalized: str) -> CacheHit:
        if not await self._available():
            self.counters.off += 1
            return CacheHit("off")
        try:
            hit = await self._lookup(scope, top_k, normalized)
        except (RedisError, OSError) as err:
            self._went_down(err)
            self.counters.off += 1
            return CacheHit("off")
        if hit.outcome == "exact":
            self.counters.exact_hits += 1
        elif hit.outcome == "fuzzy":
            self.counters.fuzzy_hits += 1
        else:
            self.counters.misses += 1
        return hit

    async def _lookup(self, scope: str, top_k: int, normalized: str) -> CacheHit:
        stored = await self._client.get(self._result_key(scope, top_k, normalized))
        if stored is not None:
            return CacheHit("exact", _decode(stored), normalized)
        if not self.fuzzy:
            return CacheHit("miss")
        index = self._index(scope, top_k)
        index.remove(normalized)  # it expired in Redis, or was never here
        matched = index.lookup(normalized)
        if matched is None:
            return CacheHit("miss")
        stored = await self._client.get(self._result_key(scope, top_k, matched))
        if stored is None:
            index.remove(matched)  # expired since it was indexed
            return CacheHit("miss")
        return CacheHit("fuzzy", _decode(stored), matched)

    async def put(self, scope: str, top_k: int, normalized: str, results: tuple[Passage, ...]) -> None:
        """Store results (empty ones are not cached, as in TAPO); a Redis failure only switches the cache off."""
        if not self._online or not results:
            return
        payload = json.dumps({"query": normalized, "results": [p.to_dict() for p in results]})
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.set(self._result_key(scope, top_k, normalized), payload, ex=self.ttl_s)
                pipe.zadd(self._index_key(scope, top_k), {normalized: time.time() + self.ttl_s})
                await pipe.execute()
        except (RedisError, OSError) as err:
            self._went_down(err)
            return
        self._index(scope, top_k).add(normalized)

    async def aclose(self) -> None:
        if self._loader is not None:
            self._loader.cancel()
        if self._redis is not None:
            await self._redis.aclose()


def _text(reply: object) -> str:
    assert isinstance(reply, str)  # the client decodes replies (decode_responses=True)
    return reply


def _decode(stored: str | bytes) -> tuple[Passage, ...]:
    return tuple(Passage.from_dict(row) for row in json.loads(stored)["results"])
