"""The run's tool registry (`rollout.tools`): one client per entry, built from the URLs of the running services
(code, search) and the entries' own settings (python, http, mcp; an MCP server is started and listed here)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.config import RunConfig
from pipeline.config.tools import (CodeToolEntry, HttpToolEntry, McpToolEntry, PythonToolEntry, SearchToolEntry,
                                   entry_name)
from pipeline.tools.base import Tool
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.mcp import mcp_tools
from pipeline.tools.search import SearchClient
from pipeline.tools.user import HttpTool, PythonTool
from pipeline.types import ToolName


def make_tools(cfg: RunConfig, urls: Mapping[ToolName, str]) -> dict[ToolName, Tool]:
    """One client per registry entry (each tool of an MCP server); a service without a URL (code, search) is
    simply not offered to the model. A name given twice (two servers listing the same tool) is refused."""
    tools: dict[ToolName, Tool] = {}
    try:
        for entry in cfg.rollout.tools:
            for tool in _clients(cfg, entry, urls):
                if tool.name in tools:
                    raise ValueError(f"rollout.tools: two tools are named {tool.name!r} (the second from "
                                     f"{entry_name(entry)!r}; an mcp entry's `prefix` keeps them apart)")
                tools[tool.name] = tool
    except BaseException:
        close_now(tools)
        raise
    return tools


# How each kind of entry becomes clients: (run config, entry, service URLs) -> the entry's tools.
_BUILDERS: dict[type, Callable[[RunConfig, Any, Mapping[ToolName, str]], list[Tool]]] = {
    CodeToolEntry: lambda cfg, _, urls: [CodeSandboxClient.from_config(cfg.sandbox, urls["code"])] if "code" in urls
    else [],
    SearchToolEntry: lambda cfg, _, urls: [SearchClient.from_config(cfg.search, urls["search"])] if "search" in urls
    else [],
    PythonToolEntry: lambda cfg, entry, _: [PythonTool(entry)],
    HttpToolEntry: lambda cfg, entry, _: [HttpTool(entry)],
    McpToolEntry: lambda cfg, entry, _: list(mcp_tools(entry)),
}


def _clients(cfg: RunConfig, entry: Any, urls: Mapping[ToolName, str]) -> list[Tool]:
    return _BUILDERS[type(entry)](cfg, entry, urls)


def close_now(tools: Mapping[ToolName, Tool]) -> None:
    """Close clients outside any running event loop (a registry that failed half-built)."""

    async def close_all() -> None:
        for tool in tools.values():
            await tool.aclose()

    asyncio.run(close_all())
