"""Scale-out: DeepSpeed ZeRO data parallelism (single process when disabled)."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class DistributedConfig(StageConfig):
    enabled: bool = Field(False, description="Train with DeepSpeed across processes (launch with deepspeed or torchrun).")
