"""The training problems, refused up front when they cannot be trained on, naming the file, line and key.

Read before the policy loads (an empty or unreadable file costs nothing), and checked against the
rollout's token budget as soon as the tokenizer is there, before the first step: a question whose
chat-templated prompt leaves no room for a full response (`rollout.max_total_tokens` minus
`rollout.max_policy_tokens`) would otherwise be cut mid-answer every time, or, for a runaway row (a
1 MB question), allocate the attention mask of a million-token context. Curation runs the same
check (`prompt_overruns`) with the tokenizer of the model the run trains, so a curated row is never
refused here for the same config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config.rollout import RolloutConfig
from pipeline.jsonl import read_problem_rows
from pipeline.rollout.engine import encode_prompt
from pipeline.rollout.protocol import make_protocol, tools_for
from pipeline.types import Problem, ToolName


class BadProblems(ValueError):
    """A training problems file that cannot be trained on (the message names file, line and key)."""


def read_training_problems(path: str | Path, limit: int = 0) -> list[tuple[int, Problem]]:
    """(line, problem) for the first `limit` problems of `path` (all for 0); raises naming file and line."""
    try:
        rows = read_problem_rows(path)
    except FileNotFoundError:
        raise BadProblems(f"{path}: no such training problems file") from None
    except ValueError as err:
        raise BadProblems(str(err)) from None
    if not rows:
        raise BadProblems(f"{path}: no training problems (the file is empty)")
    return rows[:limit] if limit else rows


@dataclass(frozen=True)
class PromptBudget:
    """What the rollout's token budget check needs: the tokenizer of the model that trains (its chat
    template encodes the prompt), the rollout config (protocol and budget) and the tools it offers."""

    tokenizer: Any
    rollout: RolloutConfig
    tools: tuple[ToolName, ...]

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
    protocol, room = make_protocol(budget.rollout.protocol), budget.room
    over, empty_prompt = [], {}
    for index, problem in enumerate(problems):
        offered = tools_for(problem, budget.tools)
        key = (offered, problem.type, problem.source)
        if key not in empty_prompt:  # the prompt around the question, encoded once per kind of problem
            blank = dataclasses.replace(problem, question="")
            empty_prompt[key] = len(encode_prompt(budget.tokenizer, protocol, blank, offered))
        # A token covers at least one UTF-8 byte (byte-level BPE, byte-fallback SentencePiece), so a question
        # of fewer bytes than the room left fits without encoding it (+2: merges across the boundary).
        if empty_prompt[key] + len(problem.question.encode("utf-8")) + 2 <= room:
            continue
        n = len(encode_prompt(budget.tokenizer, protocol, problem, offered))
        if n > room:
            over.append((index, n))
    return over


def check_prompt_budget(path: str | Path, rows: Sequence[tuple[int, Problem]], tokenizer, cfg: RolloutConfig,
                        tools: tuple[ToolName, ...]) -> None:
    """Raise `BadProblems` listing every problem whose prompt leaves no room for a full response."""
    budget = PromptBudget(tokenizer, cfg, tools)
    over = [f"{path}:{rows[i][0]}: question: {budget.reason(n)}"
            for i, n in prompt_overruns([problem for _, problem in rows], budget)]
    if over:
        raise BadProblems("\n".join(over[:20] + ([f"... and {len(over) - 20} more"] if len(over) > 20 else [])))
