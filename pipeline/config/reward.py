"""Rule-based rewards."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class RewardConfig(StageConfig):
    format_penalty: float = Field(-1.0, le=0.0, description="Reward when the format is wrong (TAPO Eq. 7).")
    overlong_buffer: int = Field(64, ge=0, description="L_cache: policy tokens over which the overlong penalty ramps to -1 (TAPO Eq. 9).")
