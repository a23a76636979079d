"""Cold-start supervised fine-tuning on tool-use traces."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class SFTConfig(StageConfig):
    enabled: bool = Field(True, description="Run SFT before RL; when False the stage copies the base model.")
    max_traces: int = Field(64, ge=0, description="Most traces to train on.")
    epochs: int = Field(1, ge=1, description="Passes over the traces.")
    batch_size: int = Field(8, ge=1, description="Traces per optimiser step.")
    lr: float = Field(5e-5, gt=0.0, lt=1.0, description="AdamW learning rate.")
    output_dir: str = Field("models/sft", min_length=1, description="Where the fine-tuned model is saved.")
