"""What every tag protocol answers (`ToolProtocol`), the records it answers with, and its prompt templates.

A protocol is stateless: one instance per protocol serves every caller (`pipeline.protocols.PROTOCOLS`).
Three parts of the tree ask it questions, each about its own step:

- the rollout engine: `stop_strings`, `read_segment` (the segment the model just wrote), `wrap_output`
  (how a tool output is shown), `messages` (the prompt that teaches the grammar);
- the scripted SFT teacher: `render_call`, `render_answer`;
- the scorer: `output` (the wrapper it looks for the engine's outputs in), `grammar_violation` (the
  format check over the model's own text) and `extract_answer`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

from pipeline.types import Problem, ToolName

PROMPTS_DIR = Path(__file__).parent / "prompts"
# Stands for an engine output inside the model's text (the format check cuts the outputs out and puts
# this in their place); no model emits NUL, and the check refuses a response that holds one.
OUTPUT_MARK = "\x00"


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found at the end of a segment. `error` is set for malformed calls."""

    tool: ToolName
    input: str
    error: str | None = None


@dataclass(frozen=True)
class SegmentEnd:
    """How a generated segment ended, as the protocol reads its text."""

    call: ParsedCall | None = None
    answered: bool = False


@dataclass(frozen=True)
class Wrapper:
    """The opener and closer the engine puts around a tool output."""

    opener: str
    closer: str


class ToolProtocol(ABC):
    """One tag protocol: everything about how its text is written and read."""

    name: ClassVar[str]  # its `rollout.protocol` value
    tools: ClassVar[tuple[ToolName, ...]]  # the tools its grammar can call
    output: ClassVar[Wrapper]  # how the engine wraps a tool output

    @abstractmethod
    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        """Where the decoder stops a segment, given the tools this prompt offers."""

    @abstractmethod
    def read_segment(self, text: str, tools: tuple[ToolName, ...]) -> SegmentEnd:
        """How the segment `text` ended: at a call (well-formed or not), at the answer, or neither."""

    @abstractmethod
    def wrap_output(self, output: str) -> str:
        """The text the engine appends after a call: the tool's (already cut) output in `self.output`."""

    @abstractmethod
    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        """How a well-formed call is written (the scripted SFT teacher writes these)."""

    @abstractmethod
    def render_answer(self, answer: str) -> str:
        """How a final answer is written."""

    @abstractmethod
    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        """The chat turns of the prompt (the system turn teaches the grammar)."""

    @abstractmethod
    def grammar_violation(self, model_text: str, *, strict: bool, eos_strings: tuple[str, ...]) -> str | None:
        """The first format violation of `model_text`, or None when it follows the grammar.

        `model_text` is the whole response with each engine output replaced by `OUTPUT_MARK`
        (`pipeline.reward.format.check_format` finds them); `strict` forbids free text between blocks
        where the grammar has blocks; `eos_strings` may follow the answer.
        """

    @abstractmethod
    def extract_answer(self, text: str) -> str | None:
        """The final answer `text` gives, or None when it gives none."""


@cache
def template(name: str) -> str:
    """A prompt template of `prompts/`, read once."""
    return (PROMPTS_DIR / name).read_text(encoding="utf-8").strip()
