"""User-defined tools registered in `rollout.tools`, without editing the library: a Python callable, or an HTTP
endpoint, with the JSON schema of its arguments.

Both receive the model's arguments as a JSON object (the chat-tools protocol has checked them against the
schema) and never raise: what goes wrong is a `ToolResult` failure, classified as every client's is
(`pipeline.tools.base`). A Python callable that raises, or runs past `timeout_s`, failed for the policy's
arguments (status "error" / "timeout"; a thread cannot be killed, so a sync function that hangs keeps its
thread until it returns: bound it yourself). An endpoint that cannot be reached, answers 429/5xx after the
retries, or not within `timeout_s`, is an outage (`infrastructure`); its 4xx answers and `{"error": ...}` are
the policy's. `concurrency` calls run at once per tool; the rest queue here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from pipeline.config.tools import HttpToolEntry, PythonToolEntry
from pipeline.tools.base import CallCounts, post_or_outage
from pipeline.types import ToolResult, ToolSpec


def shown_value(value: Any) -> str:
    """What the model reads of a tool's return value: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def load_callable(path: str, tool: str) -> Callable[..., Any]:
    """`package.module:attribute.path` imported; a ValueError names the tool and what is missing."""
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"rollout.tools {tool!r}: cannot load function {path!r}: {err}") from None
    if not callable(target):
        raise ValueError(f"rollout.tools {tool!r}: {path!r} is not callable")
    return target


def declared_spec(entry: PythonToolEntry | HttpToolEntry) -> ToolSpec:
    """The schema a user tool is declared by: its entry's name, description and parameters (known before it runs)."""
    return ToolSpec(entry.name, entry.description, dict(entry.parameters))


class PythonTool:
    """A Python callable as a tool: called with the arguments as keywords, sync ones on a worker thread."""

    def __init__(self, entry: PythonToolEntry) -> None:
        self.name, self.timeout_s = entry.name, entry.timeout_s
        self.spec = declared_spec(entry)
        self._function = load_callable(entry.function, entry.name)
        self._slots = asyncio.Semaphore(entry.concurrency)
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        async with self._slots:
            result = await self._run(json.loads(call_input))
        return self.counts.count(dataclasses.replace(result, latency_s=time.perf_counter() - started))

    async def _run(self, arguments: dict[str, Any]) -> ToolResult:
        if inspect.iscoroutinefunction(self._function):
            call = self._function(**arguments)
        else:
            call = asyncio.to_thread(self._function, **arguments)
        try:
            return ToolResult(shown_value(await asyncio.wait_for(call, self.timeout_s)), ok=True)
        except TimeoutError:
            return ToolResult.failure(f"{self.name} did not finish in {self.timeout_s}s", status="timeout")
        except Exception as err:  # the function's own failure: shown to the model like a traceback's last line
            return ToolResult.failure(f"{type(err).__name__}: {err}", status="error")

    async def aclose(self) -> None:
        pass


class HttpTool:
    """An HTTP endpoint as a tool: the arguments as a JSON POST; `{"output": ...}`, `{"error": ...}` or text back."""

    def __init__(self, entry: HttpToolEntry) -> None:
        self.name, self.url, self.retries = entry.name, entry.url, entry.retries
        self.spec = declared_spec(entry)
        self._slots = asyncio.Semaphore(entry.concurrency)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(entry.timeout_s),
                                       limits=httpx.Limits(max_connections=entry.concurrency))
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        async with self._slots:
            result = await self._post(json.loads(call_input))
        return self.counts.count(dataclasses.replace(result, latency_s=time.perf_counter() - started))

    async def _post(self, arguments: dict[str, Any]) -> ToolResult:
        answer = await post_or_outage(self._http, self.url, arguments, service=self.name, retries=self.retries)
        return answer if isinstance(answer, ToolResult) else _answer(answer)

    async def aclose(self) -> None:
        await self._http.aclose()


def _answer(response: httpx.Response) -> ToolResult:
    if response.status_code != 200:
        return ToolResult.failure(f"HTTP {response.status_code}: {response.text[:300]}", status="rejected")
    try:
        body = response.json()
    except ValueError:
        return ToolResult(response.text, ok=True)
    if isinstance(body, dict) and "error" in body and "output" not in body:
        return ToolResult.failure(shown_value(body["error"]), status="error")
    return ToolResult(shown_value(body["output"] if isinstance(body, dict) and "output" in body else body), ok=True)
