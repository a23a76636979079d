"""The code-interpreter service."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class SandboxConfig(StageConfig):
    url: str = Field("", description="Use an already running sandbox at this URL; empty = the services flow starts one.")
    port: int = Field(0, ge=0, le=65535, description="Port for a started sandbox (0 = any free port).")
    workers: int = Field(2, ge=1, le=64, description="Pre-warmed worker processes.")
    timeout_s: float = Field(5.0, gt=0.0, le=60.0, description="Wall-clock limit per snippet.")
    memory_mb: int = Field(512, ge=32, le=8192, description="Address-space limit per snippet.")
