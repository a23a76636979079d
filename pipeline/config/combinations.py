"""Combinations of settings from different sections that the pipeline does not support.

Each section validates its own keys; what only goes wrong where two sections meet is listed here, once,
so that `python -m pipeline.config check` refuses it before anything loads, with every key involved named
(the configuration-matrix test, tests/matrix, runs every documented combination and checks that each
refused one names all of its keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pipeline.config.distributed import DistributedConfig
from pipeline.config.model import ModelConfig
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig, vllm_logprobs_mode
from pipeline.config.sft import SFTConfig
from pipeline.config.tools import USER_KINDS
from pipeline.config.train import TrainConfig


class Sections(Protocol):
    """The sections the refusals read, as `pipeline.config.RunConfig` has them (it calls `refusals` as it validates:
    imported here, the two modules would import each other)."""

    @property
    def model(self) -> ModelConfig: ...
    @property
    def rollout(self) -> RolloutConfig: ...
    @property
    def reward(self) -> RewardConfig: ...
    @property
    def sft(self) -> SFTConfig: ...
    @property
    def train(self) -> TrainConfig: ...
    @property
    def distributed(self) -> DistributedConfig: ...


@dataclass(frozen=True)
class Unsupported:
    """A combination refused: the dotted keys that make it, when it applies, and why it cannot run."""

    keys: tuple[str, ...]
    applies: Callable[[Sections], bool]
    why: str

    def message(self, cfg: Sections) -> str:
        values = ", ".join(f"{key} = {_value_at(cfg, key)}" for key in self.keys)
        return f"unsupported combination: {values}: {self.why}"


def _value_at(cfg: Sections, dotted: str) -> object:
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(("train.update.autocast", "model.dtype"),
                lambda c: c.train.update.autocast != "none" and c.model.dtype != "float32",
                "a lower model.dtype already sets the forward's precision (over float32 master weights in one "
                "process, DeepSpeed's own under distributed.enabled); train.update.autocast casts the forward of float32 "
                "weights only (train.update.autocast needs model.dtype float32)"),
    Unsupported(("model.dtype", "distributed.enabled"),
                lambda c: c.model.dtype == "float16" and not c.distributed.enabled,
                "float16 gradients underflow without loss scaling, which only DeepSpeed's fp16 mode brings; one "
                "process trains float32 master weights with the forward in model.dtype (use bfloat16 or float32, "
                "or distributed.enabled true)"),
    Unsupported(("model.dtype", "sft.enabled"),
                lambda c: c.model.dtype == "float16" and c.sft.enabled,
                "the SFT stage trains in one process, with float32 master weights and the forward in model.dtype, "
                "and float16 gradients need loss scaling it does not have (use bfloat16 or float32, or sft.enabled "
                "false)"),
    Unsupported(("train.sampling.refill_dropped_groups", "rollout.schedule"),
                lambda c: c.train.sampling.refill_dropped_groups and c.rollout.schedule != "continuous",
                "a refill joins the running rollout, which turn-synchronous rounds do not have "
                "(train.sampling.refill_dropped_groups needs rollout.schedule continuous)"),
    Unsupported(("train.finetune.kind", "distributed.enabled"),
                lambda c: c.train.finetune.kind == "lora" and c.distributed.enabled,
                "the DeepSpeed backend trains full weights only (use train.finetune.kind full)"),
    Unsupported(("train.update.mask_tool_output", "train.update.logprobs_source"),
                lambda c: not c.train.update.mask_tool_output and c.train.update.logprobs_source != "recompute",
                "tool-output tokens were never sampled, so they have no sampling log-probs to form the importance "
                "ratio with (train.update.mask_tool_output false needs train.update.logprobs_source recompute)"),
    Unsupported(("reward.tepo.kind", "rollout.backend"),
                lambda c: c.reward.tepo.kind != "off" and not c.rollout.generation.records_entropies,
                "TEPO needs the sampling entropies, which the vllm backend does not record "
                "(use rollout.backend hf or reward.tepo.kind off)"),
    Unsupported(("rollout.backend", "rollout.top_p", "rollout.temperature", "train.update.logprobs_source"),
                lambda c: (not c.rollout.generation.untruncated_logprobs and c.train.update.logprobs_source == "rollout"
                           and vllm_logprobs_mode(c.rollout.temperature, c.rollout.top_p) is None),
                "vLLM records log-probs renormalised over the nucleus at this temperature, which the update "
                "would compare with untruncated ones (set train.update.logprobs_source recompute, rollout.top_p 1, "
                "or rollout.temperature 1)"),
    Unsupported(("rollout.tools", "rollout.protocol"),
                lambda c: c.rollout.protocol != "chat-tools" and any(t.kind in USER_KINDS for t in c.rollout.tools),
                "a tag protocol's grammar calls only the code and search tools; python, http and mcp tools are "
                "declared through the model's chat template (use rollout.protocol chat-tools)"),
    Unsupported(("reward.tepo.kind", "rollout.protocol"),
                lambda c: c.reward.tepo.kind == "dense" and c.rollout.protocol == "chat-tools",
                "dense TEPO gives each call its own output segment; the calls of one chat turn share theirs "
                "(use reward.tepo.kind off or sparse)"),
)


def refusals(cfg: Sections) -> list[str]:
    """One message per unsupported combination `cfg` makes (none: it can run)."""
    return [rule.message(cfg) for rule in UNSUPPORTED if rule.applies(cfg)]
