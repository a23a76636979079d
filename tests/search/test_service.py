"""The search service over real HTTP on loopback, with a real Redis and a fake Serper server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from pipeline.services.processes import ServiceProcess, redis_service
from sandbox.search.__main__ import main as search_main
from tests.search.conftest import search, start_search, write_params
from tests.search.fake_serper import FakeSerper


def test_health_search_and_stats(local_service: ServiceProcess) -> None:
    assert httpx.get(f"{local_service.url}/health").json() == {"status": "ok", "cache": "on"}
    first = search(local_service, "Which German media group is based in Ismaning?").json()
    assert first["cache"] == "miss" and first["provider"] == "local-bm25"
    assert first["results"][0]["title"] == "Constantin Medien"
    assert set(first["results"][0]) == {"title", "text", "url", "score"} and len(first["results"]) == 3
    assert first["duration_ms"] > 0
    again = search(local_service, "which german media group is based in ismaning").json()
    assert again["cache"] == "exact" and again["results"] == first["results"]
    typo = search(local_service, "Which German media group is based in Ismanning?").json()
    assert typo["cache"] == "fuzzy" and typo["results"] == first["results"]
    other_k = search(local_service, "Which German media group is based in Ismaning?", top_k=1).json()
    assert other_k["cache"] == "miss" and len(other_k["results"]) == 1
    stats = httpx.get(f"{local_service.url}/stats").json()
    assert stats["exact_hits"] >= 1 and stats["fuzzy_hits"] >= 1 and stats["misses"] >= 2
    assert stats["provider_errors"] == 0 and stats["cache_size"] >= 2 and stats["cache"] == "on"
    assert stats["scope"].startswith("local-bm25@") and stats["fuzzy"] is True


def test_retrieve_is_search_r1_compatible(local_service: ServiceProcess) -> None:
    body = {"queries": ["VIVA Polska music television", "German media group sports film marketing"], "topk": 2,
            "return_scores": True}
    result = httpx.post(f"{local_service.url}/retrieve", json=body).json()["result"]
    assert len(result) == 2 and all(len(hits) == 2 for hits in result)
    hit = result[0][0]
    assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
    assert hit["document"]["contents"].startswith('"VIVA ') and hit["score"] >= result[0][1]["score"]
    bare = httpx.post(f"{local_service.url}/retrieve", json={"queries": ["German media group"]}).json()["result"]
    assert len(bare[0]) == 3 and set(bare[0][0]) == {"id", "contents"}  # server default topk, no scores


@pytest.mark.parametrize("body", [{}, {"query": ""}, {"query": 5}, {"query": "x", "top_k": 0},
                                  {"query": "x", "top_k": 51}, {"query": "x", "extra": 1}])
def test_malformed_bodies_are_422(local_service: ServiceProcess, body: dict) -> None:
    assert httpx.post(f"{local_service.url}/search", json=body).status_code == 422


def test_long_query_is_413(local_service: ServiceProcess) -> None:
    response = search(local_service, "word " * 200)
    assert response.status_code == 413 and "limit is 512" in response.json()["detail"]
    batch = httpx.post(f"{local_service.url}/retrieve", json={"queries": ["ok", "word " * 200]})
    assert batch.status_code == 413
    assert httpx.post(f"{local_service.url}/retrieve", json={"queries": []}).status_code == 422


def test_persisted_cache_served_after_restart(hotpot_index: Path, redis_server: ServiceProcess, tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", index_dir=str(hotpot_index), fuzzy=True)
    with start_search(params, redis_server.url, tmp_path) as first:
        assert search(first, "Who founded the Bauhaus art school in Weimar?").json()["cache"] == "miss"
    with start_search(params, redis_server.url, tmp_path) as second:
        assert search(second, "who founded the bauhaus art school in weimar").json()["cache"] == "exact"
        assert search(second, "Who founded the Bauhaus art scohol in Weimar?").json()["cache"] == "fuzzy"


def test_starts_without_redis_and_recovers(hotpot_index: Path, tmp_path: Path) -> None:
    redis = redis_service(tmp_path / "redis")  # not started yet
    params = write_params(tmp_path / "params.yaml", index_dir=str(hotpot_index))
    with start_search(params, redis.url, tmp_path) as service:
        assert httpx.get(f"{service.url}/health").json()["cache"] == "off"
        down = search(service, "Constantin Medien sports marketing").json()
        assert down["cache"] == "off" and down["results"]
        with redis:
            time.sleep(1.2)  # the cache probes Redis at most once a second
            assert search(service, "Constantin Medien sports marketing").json()["cache"] == "miss"
            assert search(service, "Constantin Medien sports marketing").json()["cache"] == "exact"
            redis.stop()  # killed mid-run: still answering, uncached
            assert search(service, "Constantin Medien sports marketing").json()["cache"] == "off"
            redis.start()
            time.sleep(1.2)
            assert search(service, "Constantin Medien sports marketing").json()["cache"] == "exact"
        assert "search cache off" in service.log_tail()


def test_serper_provider_and_failures(serper_service: tuple[ServiceProcess, FakeSerper]) -> None:
    service, fake = serper_service
    fake.mode = "ok"
    errors_before = httpx.get(f"{service.url}/stats").json()["provider_errors"]
    ok = search(service, "who discovered penicillin").json()
    assert ok["provider"] == "serper" and ok["cache"] == "miss"
    assert [r["title"] for r in ok["results"]] == ["Answer", "Graph", "Result 1 for who discovered penicillin"]
    assert ok["results"][2]["url"] == "https://example.org/1"
    fake.mode = "error"
    failed = search(service, "who discovered insulin")
    assert failed.status_code == 502 and "HTTP 500" in failed.json()["detail"]
    assert search(service, "who discovered penicillin").json()["cache"] == "exact"  # the cache still serves
    fake.mode = "slow"
    timed_out = search(service, "who discovered radium")
    assert timed_out.status_code == 503 and "unreachable" in timed_out.json()["detail"]
    assert httpx.get(f"{service.url}/stats").json()["provider_errors"] - errors_before == 2
    fake.mode = "ok"


def test_serper_without_key_fails_start(tmp_path: Path) -> None:
    params = write_params(tmp_path / "params.yaml", provider="serper", serper_api_key_env="TAPO_TEST_NO_SUCH_KEY")
    with pytest.raises(ValueError, match="TAPO_TEST_NO_SUCH_KEY is not set"):
        search_main(["--port", "0", "--params", str(params)])  # fails before the port opens


async def test_concurrent_identical_misses_call_the_provider_once(
        serper_service: tuple[ServiceProcess, FakeSerper]) -> None:
    service, fake = serper_service
    fake.mode = "delay"  # the first request is still in flight when the others arrive
    before = len(fake.requests)
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as client:
        answers = await asyncio.gather(*(client.post("/search", json={"query": "Who painted The Night Watch?"})
                                         for _ in range(6)))
    fake.mode = "ok"
    assert all(a.status_code == 200 for a in answers)
    assert sorted(a.json()["cache"] for a in answers) == ["miss"] * 6
    assert len(fake.requests) - before == 1  # one Serper request for six identical queries in flight
