"""HTTP face of the sandbox: `POST /run`, SandboxFusion's `POST /run_code`, `GET /health`.

Validation happens here, before anything reaches a worker: malformed bodies are 422
(including NaN or infinite numbers, and bad `files`/`fetch_files`: see `sandbox.code.files`),
bodies over 1 MiB are 413 however they are sent (`sandbox.http_limits`), code (and stdin)
over 64 KiB is 413, and a full queue is 429 with `Retry-After`. Requested limits are capped
at the server's maxima. Error bodies never echo the input, so any body can be answered.
Responses are serialised directly (no encoder pass) because this path runs thousands of
times per training step.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from sandbox.code import files, fusion
from sandbox.http_limits import BodyLimits
from sandbox.code.pool import PoolFull, PoolSettings, WorkerPool
from sandbox.code.messages import Job, Outcome

MAX_CODE_BYTES = 64 * 1024
MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    pool: PoolSettings
    max_timeout_s: float
    max_memory_mb: int
    body_timeout_s: float = 30.0


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str = Field(..., description="Python source to run as a fresh program.")
    timeout_s: float = Field(5.0, gt=0, allow_inf_nan=False, description="Wall-clock limit; capped by the server.")
    memory_mb: int = Field(512, gt=0, description="Memory the snippet may add; capped by the server.")
    seed: int | None = Field(None, ge=0, lt=1 << 64, strict=True, description=(
        "Seeds the snippet's random generators (random, numpy, sympy): the same code and seed print the same "
        "thing in every run. None: fresh entropy for each snippet."))


def _json(body: dict, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(body).encode(), status_code, headers, media_type="application/json")


def _too_large(what: str, size: int, limit: int) -> Response:
    return _json({"detail": f"{what} is {size} bytes; the limit is {limit} bytes"}, 413)


def _invalid(exc: ValidationError | files.FileRequestError) -> Response:
    if isinstance(exc, files.FileRequestError):
        return _json({"detail": [{"type": "value_error", "loc": ["body"], "msg": str(exc)}]}, 422)
    return _json({"detail": exc.errors(include_url=False, include_context=False, include_input=False)}, 422)


def _text_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def create_app(settings: ServerSettings) -> FastAPI:
    pool = WorkerPool(settings.pool)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(title="tapo code sandbox", lifespan=lifespan)
    app.add_middleware(BodyLimits, limit=MAX_BODY_BYTES, timeout_s=settings.body_timeout_s)
    max_input_bytes = settings.pool.tmp_size_mib << 20

    async def execute(job: Job) -> Outcome | Response:
        try:
            return await pool.run(job)
        except PoolFull as exc:
            return _json({"detail": f"sandbox queue is full ({exc}); retry later"}, 429, {"Retry-After": "1"})

    def capped(code: str, timeout_s: float, memory_mb: int, **extra) -> Job:
        return Job(code=code, timeout_s=min(timeout_s, settings.max_timeout_s),
                   memory_mb=min(memory_mb, settings.max_memory_mb), **extra)

    async def run(http_request: Request) -> Response:
        # A plain Starlette route with one pydantic parse: FastAPI's per-request dependency
        # machinery costs more CPU than the rest of this handler, on the hottest path.
        try:
            request = RunRequest.model_validate_json(await http_request.body())
        except ValidationError as exc:
            return _invalid(exc)
        size = _text_size(request.code)
        if size > MAX_CODE_BYTES:
            return _too_large("code", size, MAX_CODE_BYTES)
        outcome = await execute(capped(request.code, request.timeout_s, request.memory_mb, seed=request.seed))
        return outcome if isinstance(outcome, Response) else _json(outcome.public())

    app.router.add_route("/run", run, methods=["POST"])

    async def run_code(http_request: Request) -> Response:
        try:
            request = fusion.RunCodeRequest.model_validate_json(await http_request.body())
            input_files = files.check_input_files(request.files, max_input_bytes)
            fetch_files = files.unique_fetch_names(request.fetch_files)
        except (ValidationError, files.FileRequestError) as exc:
            return _invalid(exc)
        if request.language != "python":
            return _json(fusion.unsupported_language(request.language))
        for what, text in (("code", request.code), ("stdin", request.stdin or "")):
            size = _text_size(text)
            if size > MAX_CODE_BYTES:
                return _too_large(what, size, MAX_CODE_BYTES)
        memory_mb = request.memory_limit_MB if request.memory_limit_MB > 0 else settings.max_memory_mb
        job = capped(request.code, request.run_timeout, memory_mb, stdin=request.stdin or "",
                     files=input_files, fetch_files=fetch_files, seed=request.seed)
        outcome = await execute(job)
        return outcome if isinstance(outcome, Response) else _json(fusion.response(outcome))

    app.router.add_route("/run_code", run_code, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        stats = pool.stats()
        healthy = stats["workers"] > 0
        return _json({"status": "ok" if healthy else "unavailable", **stats}, 200 if healthy else 503)

    return app
