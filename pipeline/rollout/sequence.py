"""The mutable state of one trajectory while it is being generated."""

from __future__ import annotations

from collections.abc import Hashable

from dataclasses import dataclass, field

import torch

from pipeline.protocols import Dialogue
from pipeline.types import FinishReason, Problem, ToolCall, ToolName, Trajectory


@dataclass
class Sequence:
    """Token-exact state: `response_ids`, `loss_mask`, `logprobs` and `entropies` grow together.

    An entropy is None where it is unknown: at tool-output tokens (nothing was sampled there) and
    wherever the backend does not compute it (vLLM); never a 0.0 a consumer could take for a value."""

    problem: Problem
    tools: tuple[ToolName, ...]
    prompt_ids: list[int]
    # Leading prompt tokens every prompt offering these tools shares (the system turn): the hf decoder
    # prefills them once per rollout and starts each fresh row from a copy of their cache. 0 = none.
    shared_prefix_len: int = 0
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float | None] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    segment_start: int = 0  # response index where the current sampled segment began
    turns: int = 0
    finish_reason: FinishReason | None = None
    error: str = ""  # why it ended with finish_reason "error" (`Trajectory.error`)
    draw_index: int = -1  # its place in the rollout's draw order (`rollout.draws.Draws`); -1 until drawn
    # Its own sampling generator: a row's draws must not depend on which other rows share
    # its batch, which depends on tool latency (resumed runs would otherwise diverge).
    rng: torch.Generator = field(default_factory=torch.Generator, repr=False)
    # What its protocol's renderer keeps between turns (the chat messages of a chat-template protocol).
    dialogue: Dialogue | None = field(default=None, repr=False)

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def policy_tokens(self) -> int:
        return len(self.response_ids) - self.inserted_tokens

    @property
    def inserted_tokens(self) -> int:
        return sum(1 for m in self.loss_mask if m == 0)

    def append_sampled(self, token_id: int, logprob: float, entropy: float | None) -> None:
        self.response_ids.append(token_id)
        self.loss_mask.append(1)
        self.logprobs.append(logprob)
        self.entropies.append(entropy)

    def append_inserted(self, token_ids: list[int]) -> tuple[int, int]:
        """Append tool-output tokens (mask 0); return their response span."""
        start = len(self.response_ids)
        self.response_ids.extend(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))
        self.entropies.extend([None] * len(token_ids))
        self.segment_start = len(self.response_ids)
        return start, len(self.response_ids)

    def sampled_runs(self) -> list[list[int]]:
        """The sampled ids between insertions: one run per insertion, plus the last (possibly empty)."""
        runs: list[list[int]] = [[]]
        for i, (token, m) in enumerate(zip(self.response_ids, self.loss_mask)):
            if m:
                runs[-1].append(token)
            elif i + 1 == len(self.response_ids) or self.loss_mask[i + 1]:
                runs.append([])  # the last token of an insertion
        return runs

    def to_trajectory(self, text: str, segments: tuple[str, ...] = ()) -> Trajectory:
        assert self.finish_reason is not None, "trajectory still running"
        return Trajectory(
            problem_id=self.problem.id,
            prompt_ids=tuple(self.prompt_ids),
            response_ids=tuple(self.response_ids),
            loss_mask=tuple(self.loss_mask),
            logprobs=tuple(self.logprobs),
            tool_calls=tuple(self.tool_calls),
            finish_reason=self.finish_reason,
            text=text,
            turns=self.turns,
            entropies=tuple(self.entropies),
            segments=segments,
            error=self.error,
        )


def unique_rows(keys: list[Hashable]) -> tuple[list[int], list[int]]:
    """Rows with equal keys need one computation: the first row of each distinct key (in order
    of first appearance), and for every row the position of its key among them, to index_select
    the shared results back to all rows."""
    first: dict[Hashable, int] = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    slot = {key: j for j, key in enumerate(first)}
    return list(first.values()), [slot[key] for key in keys]
