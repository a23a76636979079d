"""What a rollout backend is, for both backends (`hf.py`, `vllm.py`): a decoder per rollout (`Backend`,
`Decoder`), the sampling settings it takes, what drives it (`Scheduler`, implemented by
`rollout.episode.Episodes`), and the counters it returns. The ids that end a sequence live here too: the hf
decoder, the cold start and the benchmarks read them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.rollout.sequence import Sequence


@dataclass(frozen=True)
class SamplingParams:
    temperature: float  # 0 = greedy
    top_p: float
    max_policy_tokens: int
    max_total_tokens: int


@dataclass
class DecoderStats:
    busy_s: float = 0.0
    idle_s: float = 0.0
    sampled_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0  # context tokens served from a cache: a parked row's own, or the shared system turn's
    steps: int = 0


class Scheduler(Protocol):
    """What drives a decoder: the episodes of a rollout's rows (implemented by `rollout.episode.Episodes`).
    `take_ready` is called once per decoding step (the hf decoder's clock), `wait_ready` when nothing is ready,
    `segment_ended` with "eos", "stop" (a stop string) or "budget"."""

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]: ...
    def wait_ready(self, timeout_s: float) -> None: ...
    def unfinished(self) -> int: ...
    def segment_ended(self, seq: Sequence, stop: str) -> None: ...


class Decoder(Protocol):
    """One rollout's generation (`hf.HFDecoder`, `vllm.VLLMDecoder`): until every row has finished."""

    def run(self, scheduler: Scheduler) -> DecoderStats: ...


class Backend(Protocol):
    """A generation backend for the engine's life (`hf.HFBackend`, `vllm.VLLMBackend`)."""

    def decoder(self, params: SamplingParams, seed: int) -> Decoder: ...
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> object: ...
    def close(self) -> None: ...


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's end-of-sequence token and the model's generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)
