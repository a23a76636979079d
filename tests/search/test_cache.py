"""The Redis cache against a real redis-server: exact, fuzzy, TTL, restart, outage and recovery."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from sandbox.search import cache as cache_module
from sandbox.search.cache import SearchCache
from sandbox.search.normalize import normalize_query
from sandbox.search.results import Passage
from pipeline.services.processes import ServiceProcess, redis_service

RESULTS = (Passage(id="7-0", title="Penicillin", text="Penicillin was discovered by Alexander Fleming.", score=3.5),)


def _cache(url: str, **kwargs: object) -> SearchCache:
    # A fresh namespace per test keeps tests independent on the shared session Redis.
    options = {"ttl_s": 3600, "fuzzy_threshold": 0.9, "namespace": f"test:{uuid.uuid4().hex}", "retry_s": 0.2}
    return SearchCache(url, **{**options, **kwargs})


async def test_exact_fuzzy_and_miss(redis_server: ServiceProcess) -> None:
    cache = _cache(redis_server.url)
    assert await cache.connect()
    key = normalize_query("Who discovered penicillin?")
    assert (await cache.get("local-bm25", 3, key)).outcome == "miss"
    await cache.put("local-bm25", 3, key, RESULTS)
    exact = await cache.get("local-bm25", 3, normalize_query("who discovered PENICILLIN"))
    assert exact.outcome == "exact" and exact.results == RESULTS
    fuzzy = await cache.get("local-bm25", 3, normalize_query("who discovered penicilin"))
    assert fuzzy.outcome == "fuzzy" and fuzzy.results == RESULTS and fuzzy.matched_query == key
    assert (await cache.get("local-bm25", 5, key)).outcome == "miss"  # top_k is part of the key
    assert (await cache.get("serper", 3, key)).outcome == "miss"  # so is the provider
    assert (await cache.get("local-bm25", 3, normalize_query("who discovered insulin"))).outcome == "miss"
    assert (cache.counters.exact_hits, cache.counters.fuzzy_hits, cache.counters.misses) == (1, 1, 4)
    await cache.aclose()


async def test_persisted_cache_served_by_a_new_instance(redis_server: ServiceProcess) -> None:
    namespace = f"test:{uuid.uuid4().hex}"
    first = _cache(redis_server.url, namespace=namespace)
    await first.connect()
    await first.put("local-bm25", 3, "who discovered penicillin", RESULTS)
    await first.aclose()
    second = _cache(redis_server.url, namespace=namespace)  # as after a service restart
    assert await second.connect() and second.size() == 1
    assert (await second.get("local-bm25", 3, "who discovered penicilin")).outcome == "fuzzy"
    await second.aclose()


async def test_reload_pages_through_a_big_index(redis_server: ServiceProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "RELOAD_PAGE", 2)
    namespace = f"test:{uuid.uuid4().hex}"
    first = _cache(redis_server.url, namespace=namespace)
    await first.connect()
    questions = [f"who won the world cup in {year}" for year in range(1990, 1997)]
    for question in questions:
        await first.put("local-bm25", 3, question, RESULTS)
    second = _cache(redis_server.url, namespace=namespace)
    assert await second.connect(load_in_background=True)
    assert (await second.get("local-bm25", 3, "who won the world cup in 1990")).outcome == "exact"  # already
    await second.wait_loaded()
    assert second.size() == len(questions) and not second.loading
    assert (await second.get("local-bm25", 3, normalize_query("Who won the World Cup in 1996?"))).outcome == "exact"
    await first.aclose()
    await second.aclose()


async def test_ttl_expires_entries(redis_server: ServiceProcess) -> None:
    cache = _cache(redis_server.url, ttl_s=1)
    await cache.connect()
    await cache.put("local-bm25", 3, "who discovered penicillin", RESULTS)
    assert (await cache.get("local-bm25", 3, "who discovered penicillin")).outcome == "exact"
    await asyncio.sleep(1.2)
    assert (await cache.get("local-bm25", 3, "who discovered penicillin")).outcome == "miss"
    assert (await cache.get("local-bm25", 3, "who discovered penicilin")).outcome == "miss"
    assert cache.size() == 0  # the expired entry left the fuzzy index too
    await cache.aclose()


async def test_no_redis_means_off(caplog: pytest.LogCaptureFixture) -> None:
    cache = _cache("redis://127.0.0.1:1", retry_s=0.0)  # nothing listens on port 1
    assert not await cache.connect()
    for _ in range(3):
        assert (await cache.get("local-bm25", 3, "anything")).outcome == "off"
    assert sum("search cache off" in r.message for r in caplog.records) == 1
    await cache.put("local-bm25", 3, "anything", RESULTS)  # silently skipped
    await cache.aclose()


async def test_redis_killed_and_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with redis_service(tmp_path / "redis") as redis:
        cache = _cache(redis.url)
        await cache.connect()
        await cache.put("local-bm25", 3, "who discovered penicillin", RESULTS)
        redis.stop()
        for _ in range(3):
            assert (await cache.get("local-bm25", 3, "who discovered penicillin")).outcome == "off"
        assert sum("search cache off" in r.message for r in caplog.records) == 1  # logged once
        redis.start()
        await asyncio.sleep(0.3)  # past retry_s
        hit = await cache.get("local-bm25", 3, "who discovered penicillin")
        assert hit.outcome == "exact" and hit.results == RESULTS  # AOF kept the entry
        assert cache.online
        await cache.aclose()
