"""The run's tool registry as a test builds it from a whole config."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.config import RunConfig
from pipeline.tools.base import Tool
from pipeline.tools.factory import make_tools
from pipeline.types import ToolName


def registry(cfg: RunConfig, urls: Mapping[ToolName, str]) -> dict[ToolName, Tool]:
    """`make_tools` with the sections of `cfg` it reads."""
    return make_tools(cfg.rollout.tools, cfg.sandbox, cfg.search, urls)
