"""Tool-augmented rollouts (TAPO Algorithm 1).

What the rollout backend cannot supply to the rest of a run (TEPO's entropies, untruncated log-probs
under a nucleus) is refused with the other cross-section combinations in `pipeline.config.combinations`,
naming every key involved; `vllm_logprobs_mode` says which vLLM log-probs match the update's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import StageConfig
from pipeline.config.tools import ChatToolsConfig, CodeToolEntry, SearchToolEntry, ToolEntry, check_unique_names


@dataclass(frozen=True)
class GenerationBackend:
    """What the rest of a run needs to know about a generation backend, said once here so that no module
    compares `rollout.backend` with a name (`pipeline.rollout.backends.make_backend` builds the engine)."""

    name: Literal["hf", "vllm"]
    in_process: bool  # samples from the trained module itself (no copy of the weights to push)
    decoding_clock: bool  # steps every sequence together, so a tool's row can rejoin at a fixed decoding step
    records_entropies: bool  # the per-token entropies TEPO reads
    untruncated_logprobs: bool  # whole-vocabulary log-probs under any nucleus (vLLM: at temperature 0 or 1 only)
    packages: tuple[str, ...]  # what a process that builds it must import


BACKENDS: dict[str, GenerationBackend] = {
    "hf": GenerationBackend("hf", in_process=True, decoding_clock=True, records_entropies=True,
                         untruncated_logprobs=True, packages=()),
    "vllm": GenerationBackend("vllm", in_process=False, decoding_clock=False, records_entropies=False,
                           untruncated_logprobs=False, packages=("vllm",)),
}


class VLLMConfig(StageConfig):
    """Where the `vllm` backend's engine runs and how it shares memory (ignored by the `hf` backend).

    colocated: each training rank starts its own engine on its own GPU, which vLLM shares with the
    trainer (memory fraction, and optionally sleep mode: vLLM frees its KV cache and offloads its
    weights to host memory between rollouts). separate: the engines run on GPUs the trainer does
    not use, with tensor parallelism as an option. Weights are pushed after every optimiser step
    either way (gathered from ZeRO-3 shards when the trainer is sharded). See docs/scale-out.md."""

    placement: Literal["colocated", "separate"] = Field(
        "colocated", description="colocated: the engine shares the training rank's GPU; separate: it runs on `devices`.")
    devices: tuple[int, ...] = Field(
        (), description="placement separate: CUDA device indices (of the launcher's visible set) for the engines; "
        "local rank r takes devices[r*tp:(r+1)*tp]. Unused on CPU.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs each engine spans (tensor parallelism; needs placement separate).")
    gpu_memory_utilization: float = Field(
        0.4, gt=0.0, le=1.0,
        description="Fraction of each engine GPU's memory vLLM takes (weights + KV cache). Colocated: what the trainer "
        "does not need (e.g. 0.3-0.5); separate: up to 0.9. The CPU build sizes its cache from VLLM_CPU_KVCACHE_SPACE.")
    enable_sleep_mode: bool = Field(
        False, description="Colocated only: the engine sleeps (KV cache freed, weights offloaded to host) between "
        "rollouts and wakes for the next one. GPU platforms only; an error on CPU.")
    push_chunk_mib: int = Field(
        512, ge=1, description="Weights travel to the engine (and are gathered from ZeRO-3 shards) in chunks of about "
        "this many MiB, so the extra memory of a push stays bounded.")

    @model_validator(mode="after")
    def _placement_consistent(self) -> VLLMConfig:
        if self.placement == "colocated":
            if self.tensor_parallel_size > 1:
                raise ValueError("rollout.vllm.tensor_parallel_size > 1 needs placement: separate (a colocated engine "
                                 "lives on its training rank's one GPU)")
            if self.devices:
                raise ValueError("rollout.vllm.devices is for placement: separate (colocated engines use their rank's GPU)")
        else:
            if self.enable_sleep_mode:
                raise ValueError("rollout.vllm.enable_sleep_mode is for placement: colocated (separate GPUs have "
                                 "no trainer to free memory for)")
            if len(self.devices) % self.tensor_parallel_size:
                raise ValueError(f"rollout.vllm.devices ({len(self.devices)}) must be a multiple of "
                                 f"tensor_parallel_size ({self.tensor_parallel_size})")
        return self


class RolloutConfig(StageConfig):
    protocol: Literal["tapo", "tapo-no-think", "torl", "search-r1", "chat-tools"] = Field(
        "tapo", description="How tool calls, tool outputs and answers are written: a tag protocol (tapo, "
        "tapo-no-think: tapo without the think block, torl, search-r1), or chat-tools (the model's own chat template and call format, rollout.chat_tools).")
    chat_tools: ChatToolsConfig = Field(default_factory=ChatToolsConfig,
                                        description="protocol chat-tools: template, call parser, answer.")
    tools: tuple[ToolEntry, ...] = Field(
        (CodeToolEntry(), SearchToolEntry()),
        description="The tool registry: the project's code and search services and user tools (python, http, "
        "mcp; these need protocol chat-tools). See docs/tools.md.")
    backend: Literal["hf", "vllm"] = Field("hf", description="Generation backend: transformers, or vLLM (its own environment: scripts/setup_vllm.sh).")
    schedule: Literal["continuous", "turn-synchronous"] = Field(
        "continuous",
        description="continuous: a sequence resumes as soon as its tool answers; turn-synchronous: everyone waits "
        "for the slowest tool of each turn (TAPO/ToRL behaviour, for comparison).",
    )
    group_size: int = Field(4, ge=1, le=256, description="G: trajectories sampled per problem.")
    temperature: float = Field(1.0, ge=0.0, le=5.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description=(
        "Nucleus sampling mass. Log-probs are recorded untruncated (the whole vocabulary, as the update recomputes "
        "them); the vllm backend has those only at temperature 1 or 0, so another temperature with top_p < 1 "
        "needs train.update.logprobs_source recompute."))
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
    readmit_after_steps: int = Field(
        8, ge=0, le=1024,
        description="hf backend, continuous schedule: a sequence whose tool was called at decoding step s rejoins "
        "the batch at step s + this (the decoder waits if the tool is slower), so the batches, and every log-prob's "
        "rounding, do not depend on tool latency: a resumed run with tools is bit-identical. Larger: fewer waits on "
        "slow tools, longer idling after fast ones. 0: rejoin as soon as the tool answers (never waits, but "
        "log-probs then round differently from run to run, ~1e-6, and a resumed run with tools is not bit-identical).")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig, description="Placement and memory of the vLLM engine.")

    @property
    def generation(self) -> GenerationBackend:
        """The backend `backend` names, as the typed choice the rest of a run reads."""
        return BACKENDS[self.backend]

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, value: tuple) -> tuple:
        return check_unique_names(value)

    @model_validator(mode="after")
    def _budgets_consistent(self) -> RolloutConfig:
        if self.max_policy_tokens >= self.max_total_tokens:
            raise ValueError("max_policy_tokens must be smaller than max_total_tokens")
        return self


def vllm_logprobs_mode(temperature: float, top_p: float) -> str | None:
    """The vLLM `logprobs_mode` whose log-probs are the ones the update recomputes (the temperature-scaled
    distribution over the whole vocabulary, as the hf backend records), or None when vLLM has none.

    "processed" log-probs come after temperature and after the nucleus cut (renormalised over the nucleus);
    "raw" ones before any processing. Without a nucleus the processed ones are right; with one, the raw ones
    are right at temperature 1 (and 0: greedy samples are scored on the raw logits, as the update does)."""
    if top_p >= 1.0:
        return "processed_logprobs"
    if temperature in (0.0, 1.0):
        return "raw_logprobs"
    return None
