"""The rollout's side of the inference servers: `generate` over HTTP, token ids in, token ids, log-probs and weight
versions out (pipeline.inference.records), on the pool's servers.

Routing is sticky per trajectory key (pipeline.inference.routing); a request goes only to a READY server. A server
that fails an attempt (no connection, a connection dropped mid-request, a 5xx or 429, an answer that breaks the
protocol) is counted (pipeline.inference.outages), its keeper asked to check it at once (it is restarted if it died),
and the request is sent again, from its start, to another server, or to the same one once it is back (a restarted
server is a new one), up to `attempts` times. Every call is bounded by `deadline_s`, waits for a server included.
A request the servers answer with a 4xx other than 429 is the caller's error (a context longer than the model's)
and raises `GenerateRejected` at once, uncounted. A request no attempt completed raises `GenerateFailed`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence

import httpx

from pipeline.inference.outages import ServerCounts
from pipeline.inference.pool import ServerPool
from pipeline.inference.records import Generation, Sampling, parse_generation
from pipeline.inference.routing import Router
from pipeline.inference.server import Server
from pipeline.tools.base import AnswerTooLarge, bounded_post, infrastructure_status, response_detail

ANSWER_BYTES_PER_TOKEN = 512  # a token's id, log-prob and JSON around them take ~100 bytes


class GenerateFailed(RuntimeError):
    """No attempt of a request completed within its attempts and deadline."""


class GenerateRejected(Exception):
    """The server refused the request itself (4xx): the caller's error, not an outage."""


class InferenceClient:
    """`generate` on the pool's servers; counts go to `counts` (a `ServerOutageGuard.step` to check per step)."""

    def __init__(self, pool: ServerPool, *, deadline_s: float, attempts: int, counts: ServerCounts | None = None,
                 max_connections: int = 1024) -> None:
        self.pool, self.deadline_s, self.attempts = pool, deadline_s, attempts
        self.counts = counts if counts is not None else ServerCounts()
        self.router = Router()
        self._ids = itertools.count()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                       limits=httpx.Limits(max_connections=max_connections,
                                                           max_keepalive_connections=max_connections))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def forget(self, key: str) -> None:
        """The trajectory `key` ended: its server no longer counts it."""
        self.router.forget(key)

    async def generate(self, key: str, token_ids: Sequence[int], sampling: Sampling) -> Generation:
        """Sample a continuation of `token_ids` for trajectory `key` (see the module)."""
        tried: set[tuple[str, int]] = set()  # (server, generation) that failed this request
        errors: list[str] = []
        self.counts.requests += 1
        try:
            async with asyncio.timeout(self.deadline_s):
                for attempt in range(1, self.attempts + 1):
                    server = await self._server(key, tried)
                    outcome = await self._attempt(server, token_ids, sampling, attempt)
                    if isinstance(outcome, Generation):
                        return outcome
                    tried.add((server.name, server.generation))
                    errors.append(f"{server.name}: {outcome}")
        except TimeoutError:
            errors.append(f"no answer within the deadline of {self.deadline_s:g}s")
        message = f"generate for {key!r} failed after {len(errors)} attempt(s): " + "; ".join(errors)
        self.counts.failed_requests += 1
        self.counts.last_failed_request = message
        raise GenerateFailed(message)

    async def _server(self, key: str, tried: set[tuple[str, int]]) -> Server:
        """A READY server for `key` (waits for one): preferably one this request has not failed on; else one it failed
        on whose keeper has checked it since and found it answering (a transient error, and no other server)."""
        while True:
            ready = self.pool.ready()
            fresh = [s for s in ready if (s.name, s.generation) not in tried]
            candidates = fresh or [s for s in ready if not s.check.is_set()]
            if candidates:
                name = self.router.choose(key, [s.name for s in candidates])
                return next(s for s in candidates if s.name == name)
            await asyncio.sleep(0.1)

    async def _attempt(self, server: Server, token_ids: Sequence[int], sampling: Sampling,
                       attempt: int) -> Generation | str:
        """One attempt on `server`: the generation, or why the server failed it (counted, the keeper told)."""
        body = sampling.body(token_ids, f"tapo-{next(self._ids)}")
        limit = (sampling.max_tokens + 64) * ANSWER_BYTES_PER_TOKEN
        self.counts.attempt(server.name)
        self.router.started(server.name)
        try:
            response = await bounded_post(self._http, server.url + "/inference/v1/generate",
                                          json.dumps(body).encode(), limit)
            if response.status_code != 200 and not infrastructure_status(response.status_code):
                raise GenerateRejected(f"{server.name} refused the request: HTTP {response.status_code} "
                                       f"{response_detail(response)}")
            if response.status_code != 200:
                why = f"HTTP {response.status_code} {response_detail(response)}"
            else:
                return parse_generation(response.json(), server.name, attempt)
        except (httpx.TransportError, OSError, AnswerTooLarge, ValueError) as err:  # ProtocolError is a ValueError
            why = f"{type(err).__name__}: {err}"
        finally:
            self.router.ended(server.name)
        self.counts.failure(server.name, why)
        server.suspect(why)
        return why
