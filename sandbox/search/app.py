"""HTTP layer of the search service.

- `POST /search` `{"query", "top_k"}` -> `{"query", "results": [{"title", "text", "url", "score"}],
  "cache": "exact"|"fuzzy"|"miss"|"off", "provider", "duration_ms"}`;
- `POST /retrieve` (Search-R1 compatible) `{"queries", "topk", "return_scores"}` ->
  `{"result": [[{"document": {"id", "contents"}, "score"}]]}` (bare documents without scores);
- `GET /health`, `GET /stats`.
Errors: 422 malformed body, 413 query longer than `max_query_chars`, 502 provider gave a bad answer
after retries, 503 provider unreachable or timed out; all JSON `{"detail": ...}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from sandbox.search.service import SearchService, SearchOutcome
from sandbox.search.serper import ProviderError

MAX_TOP_K = 50
MAX_BATCH = 256


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(..., min_length=1)
    top_k: int = Field(3, ge=1, le=MAX_TOP_K)


class RetrieveRequest(BaseModel):
    queries: list[str] = Field(..., min_length=1, max_length=MAX_BATCH)
    topk: int | None = Field(None, ge=1, le=MAX_TOP_K)
    return_scores: bool = False


class QueryTooLong(Exception):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"query has {length} characters; the limit is {limit}")


def _search_body(outcome: SearchOutcome) -> dict:
    return {
        "query": outcome.query,
        "results": [{"title": p.title, "text": p.text, "url": p.url, "score": p.score} for p in outcome.results],
        "cache": outcome.cache,
        "provider": outcome.provider,
        "duration_ms": outcome.duration_ms,
    }


def _retrieve_item(outcome: SearchOutcome, with_scores: bool) -> list:
    docs = [({"id": p.id, "contents": p.contents}, p.score) for p in outcome.results]
    if with_scores:
        return [{"document": doc, "score": score} for doc, score in docs]
    return [doc for doc, _ in docs]


def create_app(make_service: Callable[[], Awaitable[SearchService]], *, max_query_chars: int, default_top_k: int) -> FastAPI:
    """The app; `make_service` runs at start-up (lifespan), so importing this module has no side effects."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = await make_service()
        yield
        await app.state.service.aclose()

    app = FastAPI(title="tapo search", lifespan=lifespan)

    def check_length(query: str) -> None:
        if len(query) > max_query_chars:
            raise QueryTooLong(len(query), max_query_chars)

    @app.exception_handler(QueryTooLong)
    async def too_long(_: Request, err: QueryTooLong) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=413)

    @app.exception_handler(ProviderError)
    async def provider_failed(_: Request, err: ProviderError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=503 if err.unavailable else 502)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "cache": "on" if app.state.service.cache.online else "off"}

    @app.get("/stats")
    async def stats() -> dict:
        return app.state.service.stats()

    @app.post("/search")
    async def search(body: SearchRequest) -> dict:
        check_length(body.query)
        return _search_body(await app.state.service.search(body.query, body.top_k))

    @app.post("/retrieve")
    async def retrieve(body: RetrieveRequest) -> dict:
        for query in body.queries:
            check_length(query)
        top_k = body.topk or default_top_k
        outcomes = await asyncio.gather(*(app.state.service.search(q, top_k) for q in body.queries))
        return {"result": [_retrieve_item(o, body.return_scores) for o in outcomes]}

    return app
