"""The run's tool registry (`rollout.tools`): one client per entry, built from the URLs of the running services
(code, search) and the entries' own settings (python, http, mcp; an MCP server is started and listed here)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config.sandbox import SandboxConfig
from pipeline.config.search import SearchConfig
from pipeline.config.tools import (CodeToolEntry, HttpToolEntry, McpToolEntry, PythonToolEntry, SearchToolEntry,
                                   ToolEntry, entry_name)
from pipeline.tools.base import Tool
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.mcp import mcp_tools
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool, PythonTool
from pipeline.types import ToolName


def make_tools(entries: Sequence[ToolEntry], sandbox: SandboxConfig, search: SearchConfig,
               urls: Mapping[ToolName, str]) -> dict[ToolName, Tool]:
    """One client per registry entry (`rollout.tools`; each tool of an MCP server); the code and search entries'
    clients take the `sandbox` and `search` sections. A service without a URL (code, search) is simply not offered
    to the model. A name given twice (two servers listing the same tool) is refused."""
    tools: dict[ToolName, Tool] = {}
    services = Services(sandbox, search, urls)
    try:
        for entry in entries:
            for tool in _BUILDERS[type(entry)](services, entry):
                if tool.name in tools:
                    raise ValueError(f"rollout.tools: two tools are named {tool.name!r} (the second from "
                                     f"{entry_name(entry)!r}; an mcp entry's `prefix` keeps them apart)")
                tools[tool.name] = tool
    except BaseException:
        close_now(tools)
        raise
    return tools


@dataclass(frozen=True)
class Services:
    """The project's own services, as the code and search entries' clients need them."""

    sandbox: SandboxConfig
    search: SearchConfig
    urls: Mapping[ToolName, str]


# How each kind of entry becomes clients: (the services, entry) -> the entry's tools.
_BUILDERS: dict[type, Callable[[Services, Any], list[Tool]]] = {
    CodeToolEntry: lambda s, _: [CodeSandboxClient.from_config(s.sandbox, s.urls["code"])] if "code" in s.urls else [],
    SearchToolEntry: lambda s, _: [SearchClient.from_config(s.search, s.urls["search"])] if "search" in s.urls else [],
    PythonToolEntry: lambda _, entry: [PythonTool(entry)],
    HttpToolEntry: lambda _, entry: [HttpTool(entry)],
    McpToolEntry: lambda _, entry: list(mcp_tools(entry)),
}


def close_now(tools: Mapping[ToolName, Tool]) -> None:
    """Close clients outside any running event loop (a registry that failed half-built)."""

    async def close_all() -> None:
        for tool in tools.values():
            await tool.aclose()

    asyncio.run(close_all())
