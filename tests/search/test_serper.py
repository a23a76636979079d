"""The Serper client against a fake Serper server on loopback: mapping, key header, retries, rate limit."""

from __future__ import annotations

import time

import pytest

from sandbox.search.serper import ProviderError, RateLimiter, SerperClient, map_serper_response
from tests.search.fake_serper import API_KEY, FakeSerper, serper_answer


def test_mapping_order_and_cut() -> None:
    results = map_serper_response(serper_answer("pluto", 5), 4)
    assert [r.title for r in results] == ["Answer", "Graph", "Result 1 for pluto", "Result 2 for pluto"]
    assert results[0].text == "The answer to pluto" and results[2].url == "https://example.org/1"
    assert [r.score for r in results] == [1.0, 0.5, 1 / 3, 0.25]
    assert map_serper_response({"organic": [{"title": "no snippet"}]}, 3) == []


async def test_search_sends_key_and_maps() -> None:
    with FakeSerper() as fake:
        client = SerperClient(fake.url, API_KEY, rate_per_s=100, timeout_s=2, retries=0)
        results = await client.search("who discovered penicillin", 3)
        await client.aclose()
    assert len(results) == 3 and results[0].title == "Answer"
    assert fake.requests == [(API_KEY, {"q": "who discovered penicillin", "num": 3})]


@pytest.mark.parametrize(("mode", "unavailable"), [("error", False), ("garbage", False), ("slow", True)])
async def test_failures_raise_after_retries(mode: str, unavailable: bool) -> None:
    with FakeSerper() as fake:
        fake.mode = mode
        client = SerperClient(fake.url, API_KEY, rate_per_s=100, timeout_s=0.3, retries=1)
        with pytest.raises(ProviderError) as info:
            await client.search("q", 3)
        await client.aclose()
    assert info.value.unavailable == unavailable
    assert len(fake.requests) == 2  # one try plus one retry


async def test_rate_limit_spaces_requests() -> None:
    limiter = RateLimiter(rate_per_s=20.0)
    started = time.monotonic()
    for _ in range(6):
        await limiter.acquire()
    assert time.monotonic() - started >= 5 / 20.0 * 0.9  # the first is free, then one per 50 ms
