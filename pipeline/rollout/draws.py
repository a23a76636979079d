"""A rollout's rows: how a problem becomes a row and a finished row a trajectory (`RowCodec`), and the rollout's
problems in draw order with their `group_size` rows each, each row's generator seeded by its key (`Draws`).

A row's key is its problem's place in the whole batch (by default its position in the draw order; a caller that
samples part of a batch, one rank of `pipeline.distributed.sharding`, passes the places) and its index in the
group, so its tokens depend on which problems were drawn before it, not on timing, nor on the rank sampling it.
"""

from __future__ import annotations

from collections.abc import Sequence as Ordered
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from pipeline.protocols import Renderer
from pipeline.protocols.tokens import decode, encode_plain
from pipeline.rollout.offered import tools_for
from pipeline.rollout.sequence import Sequence
from pipeline.rollout.watchdog import describe
from pipeline.types import Group, Problem, ToolName, Trajectory


@dataclass(frozen=True)
class RowCodec:
    """What makes a problem's row (its prompt, by the protocol's renderer, offering the tools its problem may use)
    and reads a finished row back as a trajectory (its text and segments, by the tokenizer)."""

    renderer: Renderer
    tokenizer: PreTrainedTokenizerBase
    tools: tuple[ToolName, ...]  # the run's tools
    eos_ids: frozenset[int]

    def row(self, problem: Problem) -> Sequence:
        tools = tools_for(problem, self.tools)
        try:
            dialogue = self.renderer.start(problem, tools)
        except Exception as err:  # noqa: BLE001 - this problem's prompt: its row ends, the rollout goes on
            return self._unpromptable(problem, tools, err)
        return Sequence(problem=problem, tools=tools, prompt_ids=dialogue.prompt_ids,
                        shared_prefix_len=dialogue.shared_prefix_len, dialogue=dialogue)

    def _unpromptable(self, problem: Problem, tools: tuple[ToolName, ...], err: Exception) -> Sequence:
        """A row whose prompt could not be built: it samples nothing and ends with finish reason "error" when the
        decoder first takes it. Its prompt ids are the question as plain text (never empty: a batch row must have
        a token; nothing of it is trained, it has no sampled token)."""
        try:
            prompt = encode_plain(self.tokenizer, problem.question)
        except Exception:  # noqa: BLE001 - the question itself is what failed
            prompt = []
        return Sequence(problem=problem, tools=tools, prompt_ids=prompt or [min(self.eos_ids, default=0)],
                        error=f"its prompt could not be built: {describe(err)}")

    def trajectory(self, seq: Sequence) -> Trajectory:
        return seq.to_trajectory(decode(self.tokenizer, seq.response_ids, skip_special_tokens=True),
                                 self.segment_texts(seq))

    def segment_texts(self, seq: Sequence) -> tuple[str, ...]:
        """The policy's text between insertions, each run decoded alone without the end-of-sequence token that
        closed it (`Trajectory.segments`)."""
        runs = seq.sampled_runs()
        return tuple(decode(self.tokenizer, run[:-1] if run and run[-1] in self.eos_ids else run) for run in runs)


class Draws:
    """A rollout's problems in draw order and their rows, `group_size` each (see the module)."""

    def __init__(self, rows: RowCodec, group_size: int, rollout_seed: int, keys: Ordered[int] | None = None) -> None:
        self.rows, self.group_size, self.rollout_seed, self.keys = rows, group_size, rollout_seed, keys
        self.problems: list[Problem] = []
        self.seqs: list[Sequence] = []
        self.unfinished: list[int] = []  # per problem: its rows still running
        self._groups: dict[int, Group] = {}

    def add(self, problems: list[Problem]) -> list[Sequence]:
        first = len(self.problems)
        if self.keys is not None and first + len(problems) > len(self.keys):
            raise ValueError(f"the rollout drew {first + len(problems)} problems but was given {len(self.keys)} keys")
        new = [self.rows.row(p) for p in problems for _ in range(self.group_size)]
        for index, seq in enumerate(new, start=len(self.seqs)):  # one generator per row
            k, j = divmod(index, self.group_size)
            key = k if self.keys is None else self.keys[k]
            seq.rng.manual_seed(self.rollout_seed * 100_003 + key * self.group_size + j)
            seq.draw_index = index
        self.problems += problems
        self.seqs += new
        self.unfinished += [self.group_size] * len(problems)
        return new

    def group_of(self, seq: Sequence) -> int:
        """The index of the row's problem."""
        return seq.draw_index // self.group_size

    def group(self, k: int) -> Group:
        """Problem k's finished group (built once)."""
        if k not in self._groups:
            seqs = self.seqs[k * self.group_size:(k + 1) * self.group_size]
            self._groups[k] = Group(self.problems[k], tuple(self.rows.trajectory(s) for s in seqs))
        return self._groups[k]
