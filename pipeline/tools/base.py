"""The shape of a tool, as the rollout engine sees it.

A tool is an async callable from the model's call text (code, or a search query) to a
`ToolResult`. Implementations must not raise: timeouts, connection errors and bad
responses become `ToolResult.failure(...)` so one broken call never kills a batch.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pipeline.types import ToolName, ToolResult


@runtime_checkable
class Tool(Protocol):
    name: ToolName

    async def __call__(self, call_input: str) -> ToolResult: ...

    async def aclose(self) -> None: ...
