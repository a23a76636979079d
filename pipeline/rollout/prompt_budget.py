"""The rollout's token budget for a prompt: a question whose chat-templated prompt, encoded as the
rollout encodes it, leaves no room for a full response (`rollout.max_total_tokens` minus
`rollout.max_policy_tokens`). One definition for curation (filter `too_long`) and the training run's
load-time check (`pipeline.sampling.training_problems`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import HttpToolEntry, PythonToolEntry
from pipeline.protocols import protocol_of
from pipeline.protocols.tokens import special_token_ids
from pipeline.rollout.offered import tools_for
from pipeline.tools.user import declared_spec
from pipeline.types import BUILTIN_SPECS, BUILTIN_TOOLS, Problem, ToolName, ToolSpec


@dataclass(frozen=True)
class PromptBudget:
    """What the rollout's token budget check needs: the tokenizer of the model that trains (its chat
    template encodes the prompt), the rollout config (protocol and budget) and the tools it offers, with
    their schemas (a chat-template protocol declares them in the prompt; an MCP server's are known only once
    it runs, so curation counts the built-in ones and the configured python and http tools: `before_start`)."""

    tokenizer: Any
    rollout: RolloutConfig
    tools: tuple[ToolName, ...]
    specs: Mapping[ToolName, ToolSpec] = field(default_factory=lambda: dict(BUILTIN_SPECS))

    @classmethod
    def before_start(cls, tokenizer: Any, rollout: RolloutConfig) -> PromptBudget:
        """The budget as far as it is known before any tool runs (curation): every built-in tool a problem's
        type may use, and each python or http entry of `rollout.tools` with the schema it is declared by."""
        specs = dict(BUILTIN_SPECS)
        for entry in rollout.tools:
            if isinstance(entry, (PythonToolEntry, HttpToolEntry)):
                specs[entry.name] = declared_spec(entry)
        return cls(tokenizer, rollout, BUILTIN_TOOLS + tuple(n for n in specs if n not in BUILTIN_TOOLS), specs)

    @property
    def room(self) -> int:
        """Prompt tokens that leave room for a full response."""
        return self.rollout.max_total_tokens - self.rollout.max_policy_tokens

    def reason(self, tokens: int) -> str:
        return (f"the prompt is {tokens} tokens; rollout.max_total_tokens {self.rollout.max_total_tokens} - "
                f"rollout.max_policy_tokens {self.rollout.max_policy_tokens} leaves {self.room}")


def prompt_overruns(problems: Sequence[Problem], budget: PromptBudget) -> list[tuple[int, int]]:
    """(index, prompt tokens) of every problem whose chat-templated prompt, encoded as the rollout
    encodes it, leaves no room for a full response. Shared by curation and the load-time check."""
    # any special token may close a turn here: only the prompt is rendered, and its ids do not depend on it
    renderer = protocol_of(budget.rollout).bind(budget.tokenizer, budget.specs, special_token_ids(budget.tokenizer))
    room = budget.room
    over, empty_prompt = [], {}
    for index, problem in enumerate(problems):
        offered = tools_for(problem, budget.tools)
        key = (offered, problem.type, problem.source)
        if key not in empty_prompt:  # the prompt around the question, encoded once per kind of problem
            blank = dataclasses.replace(problem, question="")
            empty_prompt[key] = len(renderer.start(blank, offered).prompt_ids)
        # A token covers at least one UTF-8 byte (byte-level BPE, byte-fallback SentencePiece), so a question
        # of fewer bytes than the room left fits without encoding it (+2: merges across the boundary).
        if empty_prompt[key] + len(problem.question.encode("utf-8")) + 2 <= room:
            continue
        n = len(renderer.start(problem, offered).prompt_ids)
        if n > room:
            over.append((index, n))
    return over
