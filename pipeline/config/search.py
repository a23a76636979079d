"""The search service and its Redis cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.config.base import StageConfig


class SearchConfig(StageConfig):
    url: str = Field("", description="Use an already running search service at this URL; empty = the services flow starts one.")
    port: int = Field(0, ge=0, le=65535, description="Port for a started search service (0 = any free port).")
    backend: Literal["local-bm25", "serper"] = Field("local-bm25", description="Where results come from.")
    redis_url: str = Field("", description="Redis for the cache; empty = the services flow starts a private one.")
    top_k: int = Field(3, ge=1, le=50, description="Results per query.")
