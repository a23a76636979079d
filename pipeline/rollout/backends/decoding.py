"""What a rollout backend's decoder is, for both backends (`hf.py`, `vllm.py`): the sampling settings it
takes, the loop it is driven by (`Scheduler`, implemented by `rollout.engine`), and the counters it returns.
The ids that end a sequence live here too: the hf decoder, the cold start and the benchmarks read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

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
    """What the decoder needs from the rollout loop (implemented by rollout.engine)."""

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]: ...
    def wait_ready(self, timeout_s: float) -> None: ...
    def unfinished(self) -> int: ...
    def segment_ended(self, seq: Sequence, reason: str) -> None: ...


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's end-of-sequence token and the model's generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return frozenset(i for i in ids if i is not None)
