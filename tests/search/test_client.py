"""The rollout's search tool against the real service: formatted output, and failures as ToolResults."""

from __future__ import annotations

import httpx

from pipeline.config.search import SearchConfig
from pipeline.services.processes import ServiceProcess, free_port
from pipeline.tools.base import Tool
from pipeline.tools.search import SearchClient, _parse
from tests.search.fake_serper import FakeSerper


async def test_formats_results_like_search_r1(local_service: ServiceProcess) -> None:
    client = SearchClient(local_service.url, top_k=2)
    assert isinstance(client, Tool) and client.name == "search"
    result = await client("Which German media group is based in Ismaning?")
    await client.aclose()
    assert result.ok and result.status == "ok" and result.error is None and result.latency_s > 0
    lines = result.output.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Doc 1 (Title: Constantin Medien) Constantin Medien AG")
    assert lines[1].startswith("Doc 2 (Title: ")


async def test_refused_queries_are_rejected(local_service: ServiceProcess) -> None:
    client = SearchClient.from_config(SearchConfig(top_k=1), local_service.url)
    too_long = await client("word " * 200)
    empty = await client("   ")
    await client.aclose()
    assert not too_long.ok and too_long.status == "rejected" and "limit is 512" in too_long.output
    assert not empty.ok and empty.status == "rejected"


async def test_unreachable_service_is_unavailable() -> None:
    client = SearchClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5, retries=1)
    result = await client("anything")
    await client.aclose()
    assert not result.ok and result.status == "unavailable" and "ConnectError" in result.output


async def test_provider_failure_is_unavailable(serper_service: tuple[ServiceProcess, FakeSerper]) -> None:
    service, fake = serper_service
    fake.mode = "error"
    client = SearchClient(service.url, retries=1)
    result = await client("a question nobody asked before")
    await client.aclose()
    fake.mode = "ok"
    assert not result.ok and result.status == "unavailable" and "HTTP 502" in result.output


def test_no_results_is_ok() -> None:
    result = _parse(httpx.Response(200, json={"results": []}))
    assert result.ok and result.output == "No results found."
