"""Build the tool clients a run uses from the URLs of running services."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.config import RunConfig
from pipeline.tools.base import Tool
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import ToolName


def make_tools(cfg: RunConfig, urls: Mapping[ToolName, str]) -> dict[ToolName, Tool]:
    """One client per service given; a tool without a URL is simply not offered to the model."""
    tools: dict[ToolName, Tool] = {}
    if "code" in urls:
        tools["code"] = CodeSandboxClient.from_config(cfg.sandbox, urls["code"])
    if "search" in urls:
        tools["search"] = SearchClient.from_config(cfg.search, urls["search"])
    return tools
