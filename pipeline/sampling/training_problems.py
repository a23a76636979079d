"""The training problems, refused up front when they cannot be trained on, naming the file, line and key.

Read before the policy loads (an empty or unreadable file costs nothing), and checked against the
rollout's token budget as soon as the tokenizer is there, before the first step: a question whose
chat-templated prompt leaves no room for a full response (`rollout.max_total_tokens` minus
`rollout.max_policy_tokens`) would otherwise be cut mid-answer every time, or, for a runaway row (a
1 MB question), allocate the attention mask of a million-token context. Curation runs the same
check (`pipeline.rollout.prompt_budget.prompt_overruns`) with the tokenizer of the model the run trains, so a curated row is never
refused here for the same config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.config.rollout import RolloutConfig
from pipeline.jsonl import read_problem_rows
from pipeline.rollout.prompt_budget import PromptBudget, prompt_overruns
from pipeline.types import Problem, ToolName, ToolSpec


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


def check_prompt_budget(path: str | Path, rows: Sequence[tuple[int, Problem]], tokenizer, cfg: RolloutConfig,
                        tools: tuple[ToolName, ...], specs: Mapping[ToolName, ToolSpec] | None = None) -> None:
    """Raise `BadProblems` listing every problem whose prompt leaves no room for a full response (the tools
    declared by `specs` when a chat template declares them; the built-in ones by default)."""
    budget = PromptBudget(tokenizer, cfg, tools, **({"specs": specs} if specs is not None else {}))
    over = [f"{path}:{rows[i][0]}: question: {budget.reason(n)}"
            for i, n in prompt_overruns([problem for _, problem in rows], budget)]
    if over:
        raise BadProblems("\n".join(over[:20] + ([f"... and {len(over) - 20} more"] if len(over) > 20 else [])))
