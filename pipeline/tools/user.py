"""User-defined tools registered in `rollout.tools`, without editing the library: a Python callable, or an HTTP
endpoint, with the JSON schema of its arguments.

Both receive the model's arguments as a JSON object (the chat-tools protocol has checked them against the
schema) and never raise: what goes wrong is a `ToolResult` failure, classified as every client's is
(`pipeline.tools.base`). Arguments that are not a JSON object of valid Unicode are refused, the policy's error,
before the tool sees them. A Python callable that raises failed for the policy's arguments (status "error");
an endpoint's 4xx answers and `{"error": ...}` are the policy's too.

`timeout_s` is the deadline of the whole call, for both kinds (for an endpoint: connecting, sending, every
retry and back-off, and reading all of the answer; before, it bounded each read, and an endpoint dripping a byte
at a time held a call for as long as it liked and counted as a success). A call past it is the tool's failure,
an outage (`infrastructure`), whatever the arguments: the policy cannot see why a tool was slow, and a tool that
keeps hanging must stop the run, naming it, not go on eating calls. So is an endpoint that cannot be reached
or answers 429/5xx after the retries. A sync callable runs on the tool's own threads (`ToolThreads`, at most
`concurrency`): a thread cannot be killed, so a hung call keeps its thread; once every thread is held so, further
calls are refused at once (status "saturated", an outage) and other tools are not touched. An answer over
`max_answer_bytes` (an endpoint's body, read no further; a callable's shown value) is cut (status "too_large"),
not an outage: its size answers the arguments. At most `concurrency` calls run at once per tool; the rest queue.
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
from pipeline.tools.base import (AnswerTooLarge, CallCounts, CallLimits, parse_arguments, post_or_outage,
                                 too_large)
from pipeline.tools.threads import Saturated, ToolThreads
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


def bounded_text(text: str, limit: int) -> str:
    """`text` if its UTF-8 form fits `limit` bytes; raises AnswerTooLarge (without encoding a text that cannot)."""
    if len(text) > limit or (4 * len(text) > limit and len(text.encode("utf-8", "surrogatepass")) > limit):
        raise AnswerTooLarge(limit)
    return text


class PythonTool:
    """A Python callable as a tool: called with the arguments as keywords, sync ones on the tool's own threads."""

    def __init__(self, entry: PythonToolEntry) -> None:
        self.name, self.timeout_s, self.max_answer_bytes = entry.name, entry.timeout_s, entry.max_answer_bytes
        self.spec = declared_spec(entry)
        self._function = load_callable(entry.function, entry.name)
        self._is_async = inspect.iscoroutinefunction(self._function)
        self._slots = asyncio.Semaphore(entry.concurrency)  # async functions; sync ones queue for their threads
        self._threads = ToolThreads(entry.name, entry.concurrency)
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        arguments = parse_arguments(call_input)
        if isinstance(arguments, ToolResult):
            return self.counts.count(arguments)
        if self._is_async:
            async with self._slots:
                result = await self._run(arguments.values)
        else:
            result = await self._run(arguments.values)
        return self.counts.count(dataclasses.replace(result, latency_s=time.perf_counter() - started))

    async def _run(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            if self._is_async:
                value = await asyncio.wait_for(self._function(**arguments), self.timeout_s)
            else:
                value = await self._threads.run(self._function, arguments, self.timeout_s)
            return ToolResult(bounded_text(shown_value(value), self.max_answer_bytes), ok=True)
        except TimeoutError:
            return ToolResult.failure(f"{self.name} did not finish in {self.timeout_s}s", status="timeout",
                                      infrastructure=True)
        except Saturated as err:
            return ToolResult.failure(f"{self.name} was not called: {err}", status="saturated", infrastructure=True)
        except AnswerTooLarge as err:
            return too_large(self.name, err)
        except Exception as err:  # the function's own failure: shown to the model like a traceback's last line
            return ToolResult.failure(f"{type(err).__name__}: {err}", status="error")

    async def aclose(self) -> None:
        pass


class HttpTool:
    """An HTTP endpoint as a tool: the arguments as a JSON POST; `{"output": ...}`, `{"error": ...}` or text back."""

    def __init__(self, entry: HttpToolEntry) -> None:
        self.name, self.url, self.retries = entry.name, entry.url, entry.retries
        self.limits = CallLimits(entry.timeout_s, entry.max_answer_bytes)
        self.spec = declared_spec(entry)
        self._slots = asyncio.Semaphore(entry.concurrency)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(entry.timeout_s),
                                       limits=httpx.Limits(max_connections=entry.concurrency))
        self.counts = CallCounts()

    async def __call__(self, call_input: str) -> ToolResult:
        started = time.perf_counter()
        arguments = parse_arguments(call_input)
        if isinstance(arguments, ToolResult):
            return self.counts.count(arguments)
        async with self._slots:
            answer = await post_or_outage(self._http, self.url, arguments.body, service=self.name,
                                          retries=self.retries, limits=self.limits)
        result = answer if isinstance(answer, ToolResult) else _answer(answer)
        return self.counts.count(dataclasses.replace(result, latency_s=time.perf_counter() - started))

    async def aclose(self) -> None:
        await self._http.aclose()


def _answer(response: httpx.Response) -> ToolResult:
    if response.status_code != 200:
        return ToolResult.failure(f"HTTP {response.status_code}: {response.text[:300]}", status="rejected")
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return ToolResult(response.text, ok=True)
    try:
        if isinstance(body, dict) and "error" in body and "output" not in body:
            return ToolResult.failure(shown_value(body["error"]), status="error")
        return ToolResult(shown_value(body["output"] if isinstance(body, dict) and "output" in body else body), ok=True)
    except (ValueError, RecursionError):  # JSON nested too deeply to write again: shown as it came
        return ToolResult(response.text, ok=True)
