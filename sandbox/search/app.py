"""HTTP layer of the search service.

- `POST /search` `{"query", "top_k"}` -> `{"query", "results": [{"title", "text", "url", "score"}],
  "cache": "exact"|"fuzzy"|"miss"|"off", "provider", "duration_ms"}`;
- `POST /retrieve` (Search-R1 compatible) `{"queries", "topk", "return_scores"}` ->
  `{"result": [[{"document": {"id", "contents"}, "score"}]]}` (bare documents without scores);
- `GET /health`, `GET /stats`.
Errors, all JSON `{"detail": ...}`: 422 a body that is not JSON, not UTF-8, holds a lone surrogate
(`"\\ud83d"`: text no encoder can write, so no cache key, provider request or answer could carry
it) or has the wrong shape; 413 a body over `body_limit(max_query_chars)` however it is sent, refused
before it is read whole (`sandbox.http_limits`, as the code sandbox), or a query longer than
`max_query_chars`; 408 a body slower than `BODY_TIMEOUT_S`; 502 the provider gave a bad answer after
retries, 503 it was unreachable or timed out. Every input gets a 4xx or an answer, never a 500.
Departure from FastAPI's defaults (as the code sandbox): bodies are parsed by pydantic's JSON parser
straight from the bytes, and errors never echo the input, so no input can make the error itself
unrenderable; responses are ASCII JSON, which any text can be written as.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sandbox.http_limits import BodyLimits
from sandbox.search.service import SearchService, SearchOutcome
from sandbox.search.serper import ProviderError

MAX_TOP_K = 50
MAX_BATCH = 256
BODY_TIMEOUT_S = 30.0
# The next request head must arrive within this of the connection opening or the last answer. As long as
# the keep-alive it bounds (`__main__`), so a client's pooled connection idles as long as it did before.
HEADER_TIMEOUT_S = 30.0
# The longest JSON spelling of one character: a non-BMP one as two \uXXXX escapes.
MAX_JSON_BYTES_PER_CHAR = 12


def body_limit(max_query_chars: int) -> int:
    """Bytes of the largest request a client may need: a full /retrieve batch of the longest queries with
    every character escaped, plus room for the other fields and whitespace. Anything longer is refused
    before it is read."""
    return 4096 + MAX_BATCH * (max_query_chars * MAX_JSON_BYTES_PER_CHAR + 16)


def _encodable(text: str) -> str:
    """Refuse text with a lone surrogate. The JSON parser refuses it already; this also holds a request
    built in Python (`model_validate`), so the service never sees text it cannot write."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text holds a lone surrogate, which no UTF-8 text can carry") from None
    return text


Query = Annotated[str, Field(min_length=1), AfterValidator(_encodable)]


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: Query
    top_k: int = Field(3, ge=1, le=MAX_TOP_K)


class RetrieveRequest(BaseModel):
    queries: list[Query] = Field(..., min_length=1, max_length=MAX_BATCH)
    topk: int | None = Field(None, ge=1, le=MAX_TOP_K)
    return_scores: bool = False


Model = TypeVar("Model", bound=BaseModel)


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: any Python text can be written so, a lone surrogate
    included (Starlette's default writes UTF-8, which raises on one and turns an answer into a 500)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


class QueryTooLong(Exception):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"query has {length} characters; the limit is {limit}")


class BadBody(Exception):
    """The body is not the route's JSON: its errors, without the input they were about."""

    def __init__(self, err: ValidationError) -> None:
        super().__init__("invalid request body")
        self.errors = err.errors(include_url=False, include_context=False, include_input=False)


async def _parse(request: Request, model: type[Model]) -> Model:
    # Straight from the bytes: pydantic's parser refuses invalid UTF-8, lone surrogates and nesting past
    # its depth limit as ValidationErrors, where json.loads would give surrogates or raise RecursionError.
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        raise BadBody(err) from None


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

    app = FastAPI(title="tapo search", lifespan=lifespan, default_response_class=AsciiJSONResponse)
    app.add_middleware(BodyLimits, limit=body_limit(max_query_chars), timeout_s=BODY_TIMEOUT_S)

    def check_length(query: str) -> None:
        if len(query) > max_query_chars:
            raise QueryTooLong(len(query), max_query_chars)

    @app.exception_handler(BadBody)
    async def bad_body(_: Request, err: BadBody) -> JSONResponse:
        return AsciiJSONResponse({"detail": err.errors}, status_code=422)

    @app.exception_handler(QueryTooLong)
    async def too_long(_: Request, err: QueryTooLong) -> JSONResponse:
        return AsciiJSONResponse({"detail": str(err)}, status_code=413)

    @app.exception_handler(ProviderError)
    async def provider_failed(_: Request, err: ProviderError) -> JSONResponse:
        return AsciiJSONResponse({"detail": str(err)}, status_code=503 if err.unavailable else 502)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "cache": "on" if app.state.service.cache.online else "off"}

    @app.get("/stats")
    async def stats() -> dict:
        return app.state.service.stats()

    @app.post("/search")
    async def search(request: Request) -> dict:
        body = await _parse(request, SearchRequest)
        check_length(body.query)
        return _search_body(await app.state.service.search(body.query, body.top_k))

    @app.post("/retrieve")
    async def retrieve(request: Request) -> dict:
        body = await _parse(request, RetrieveRequest)
        for query in body.queries:
            check_length(query)
        top_k = body.topk or default_top_k
        outcomes = await asyncio.gather(*(app.state.service.search(q, top_k) for q in body.queries))
        return {"result": [_retrieve_item(o, body.return_scores) for o in outcomes]}

    return app
