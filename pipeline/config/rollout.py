"""Tool-augmented rollouts (TAPO Algorithm 1)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig


class RolloutConfig(StageConfig):
    protocol: Literal["tapo", "torl", "search-r1"] = Field("tapo", description="Tag protocol: how tool calls, tool outputs and answers are written.")
    backend: Literal["hf", "vllm"] = Field("hf", description="Generation backend: transformers, or vLLM (its own environment: scripts/setup_vllm.sh).")
    schedule: Literal["continuous", "turn-synchronous"] = Field(
        "continuous",
        description="continuous: a sequence resumes as soon as its tool answers; turn-synchronous: everyone waits "
        "for the slowest tool of each turn (TAPO/ToRL behaviour, for comparison).",
    )
    group_size: int = Field(4, ge=1, le=256, description="G: trajectories sampled per problem.")
    temperature: float = Field(1.0, ge=0.0, le=5.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_policy_tokens: int = Field(256, ge=1, description="Budget of sampled tokens per trajectory (tool output excluded).")
    max_total_tokens: int = Field(1024, ge=16, description="Budget of prompt + response tokens per trajectory.")
    max_tool_calls: int = Field(2, ge=0, description="C: tool calls answered per trajectory; later calls get 'tool budget exhausted' (ToRL).")
    max_turns: int = Field(4, ge=1, description="Generation segments per trajectory.")
    max_tool_output_chars: int = Field(1024, ge=32, description="Tool output longer than this is cut to head ... tail.")
    max_batch_sequences: int = Field(16, ge=1, description="Sequences generated together (vLLM: max_num_seqs).")
    max_parked_kv_tokens: int = Field(
        65536, ge=0,
        description="hf backend: context tokens whose KV cache parked sequences keep while waiting on a tool, so "
        "re-admission prefills only the tool output (0 = always re-prefill the whole context).",
    )
    tool_concurrency: int = Field(8, ge=1, description="Concurrent requests per tool service.")

    @model_validator(mode="after")
    def _budgets_consistent(self) -> RolloutConfig:
        if self.max_policy_tokens >= self.max_total_tokens:
            raise ValueError("max_policy_tokens must be smaller than max_total_tokens")
        return self
