"""What every protocol answers (`ToolProtocol`), the records it answers with, its token side (`Renderer`), and its
prompt templates.

A protocol is stateless: one instance per protocol (and, for `chat-tools`, per configuration) serves every
caller (`pipeline.protocols.protocol_for`). Three parts of the tree ask it questions, each about its own step:

- the rollout engine, through the protocol's `Renderer` for its tokenizer (`bind`): the prompt's ids, the stop
  strings, how a segment ended (`read_segment`: the calls it wrote, or its answer), and the ids appended
  after the calls (for the tag protocols `wrap_output` as plain text; for `chat-tools` the chat template's own
  rendering of the tool messages);
- the scripted SFT teacher: `render_call`, `render_answer`, and the same `Renderer`;
- the scorer: `model_segments` or `output` (how it tells the model's text from the engine's),
  `grammar_violation` (the format check over the model's own text) and `extract_answer`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from transformers import PreTrainedTokenizerBase

from pipeline.protocols.tokens import chat_ids, decode, encode_plain, encode_template_text, special_token_ids
from pipeline.types import Problem, ToolName, ToolSpec, Trajectory

PROMPTS_DIR = Path(__file__).parent / "prompts"
# Stands for an engine output inside the model's text (the format check cuts the outputs out and puts
# this in their place); no model emits NUL, and the check refuses a response that holds one.
OUTPUT_MARK = "\x00"


MALFORMED = "malformed"  # the status of a call a protocol could not read or the tool's schema refused


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found in a segment. `error` is set for malformed calls (answered with it, never run).

    `input` is what the tool client receives: the text between a tag protocol's tags, or for a chat-template
    call the text argument of a text tool (`ToolSpec.text_argument`) or the arguments as a JSON object.
    `status` is the status of the failure a malformed call is answered with."""

    tool: ToolName
    input: str
    error: str | None = None
    status: str = "rejected"


@dataclass(frozen=True)
class SegmentEnd:
    """How a generated segment ended, as the protocol reads its text: at calls (one for the tag protocols,
    any number in a chat turn, run together and answered in order), at the answer, or neither."""

    calls: tuple[ParsedCall, ...] = ()
    answered: bool = False

    @property
    def call(self) -> ParsedCall | None:
        """The first call (the tag protocols write one per segment)."""
        return self.calls[0] if self.calls else None


@dataclass
class Dialogue:
    """One trajectory's conversation as its protocol's `Renderer` keeps it between turns."""

    prompt_ids: list[int]
    # Leading prompt tokens every prompt offering these tools shares (the system turn); 0 = none.
    shared_prefix_len: int = 0
    tools: tuple[ToolName, ...] = ()  # the tools the prompt offers
    # Chat protocols: the conversation so far as chat messages with their real text (the template renders
    # it anew each turn); the tag protocols keep none.
    messages: list[dict[str, Any]] = field(default_factory=list)


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
    def read_segment(self, text: str, tools: tuple[ToolName, ...], *, at_eos: bool = False) -> SegmentEnd:
        """How the segment `text` ended: at a call (well-formed or not), at the answer, or neither.

        `at_eos`: the segment ended at an end-of-sequence token (not in `text`), where the tag protocols
        have nothing to read (their calls end at stop strings) and a chat turn is complete."""

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

    def model_segments(self, trajectory: Trajectory) -> list[str] | None:
        """The model's own text between the engine's insertions, read off the trajectory; None (the tag
        protocols) when the scorer is to find the engine's outputs in the text by their wrapper and content."""
        return None

    def bind(self, tokenizer: PreTrainedTokenizerBase, specs: Mapping[ToolName, ToolSpec],
             eos_ids: frozenset[int]) -> Renderer:
        """This protocol's token side for `tokenizer` and the run's tools (resolved once, at set-up)."""
        return TextRenderer(self, tokenizer)


class Renderer(ABC):
    """A protocol's token side for one tokenizer: a trajectory's prompt, where its segments stop, how a segment
    ended, and the ids the engine appends (loss mask 0) after a segment's calls. Sampled ids are never
    re-tokenized: a segment is only decoded, to be read."""

    protocol: ToolProtocol

    @abstractmethod
    def start(self, problem: Problem, tools: tuple[ToolName, ...]) -> Dialogue:
        """The dialogue of a new trajectory: its prompt ids."""

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        return self.protocol.stop_strings(tools)

    @abstractmethod
    def read(self, dialogue: Dialogue, segment_ids: Sequence[int], tools: tuple[ToolName, ...],
             at_eos: bool) -> SegmentEnd:
        """How the segment of sampled `segment_ids` ended (its last id is the end-of-sequence one `at_eos`)."""

    @abstractmethod
    def reply(self, dialogue: Dialogue, segment_ids: Sequence[int], answered: Sequence[tuple[ParsedCall, str]]
              ) -> list[int]:
        """The ids appended after the segment: each call's shown output (already cut), in order, as the
        protocol shows it, up to where the model writes next."""

    @abstractmethod
    def segment_ids(self, text: str, *, final: bool) -> list[int]:
        """A teacher's segment as the model would sample it (the SFT traces): `text` (a rendered call, or the
        `final` answer) and what ends it (a stop string in the text, or the end-of-turn/sequence token)."""


class TextRenderer(Renderer):
    """The tag protocols' token side: the chat-templated prompt; one call per segment, its output wrapped by
    the protocol (`wrap_output`) and encoded as plain text (`encode_plain`)."""

    def __init__(self, protocol: ToolProtocol, tokenizer: PreTrainedTokenizerBase) -> None:
        self.protocol, self.tokenizer = protocol, tokenizer
        self._special_ids = special_token_ids(tokenizer)

    def start(self, problem: Problem, tools: tuple[ToolName, ...]) -> Dialogue:
        messages = self.protocol.messages(problem, tools)
        prompt = chat_ids(self.tokenizer, messages, add_generation_prompt=True)
        return Dialogue(prompt, system_turn_length(self.tokenizer, messages, prompt), tools)

    def read(self, dialogue: Dialogue, segment_ids: Sequence[int], tools: tuple[ToolName, ...],
             at_eos: bool) -> SegmentEnd:
        return self.protocol.read_segment(decode(self.tokenizer, list(segment_ids)), tools, at_eos=at_eos)

    def reply(self, dialogue: Dialogue, segment_ids: Sequence[int], answered: Sequence[tuple[ParsedCall, str]]
              ) -> list[int]:
        (_, shown), = answered  # a tag segment ends at its one call
        return encode_plain(self.tokenizer, self.protocol.wrap_output(shown), self._special_ids)

    def segment_ids(self, text: str, *, final: bool) -> list[int]:
        ids = encode_template_text(self.tokenizer, text)  # a call ends at its stop string, the answer at EOS
        return ids + [self.tokenizer.eos_token_id] if final else ids


def system_turn_length(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], prompt_ids: list[int]
                       ) -> int:
    """How many leading tokens of `prompt_ids` are the system turn alone, as the template renders it
    (0 when there is none, or when the full prompt does not start with exactly those tokens)."""
    if messages[0]["role"] != "system":
        return 0
    turn = chat_ids(tokenizer, messages[:1], add_generation_prompt=False)
    return len(turn) if len(turn) < len(prompt_ids) and prompt_ids[:len(turn)] == turn else 0


def strip_eos(tail: str, eos_strings: tuple[str, ...]) -> str:
    """`tail` stripped of whitespace and of any end-of-sequence strings at its end."""
    tail = tail.strip()
    changed = True
    while changed and tail:
        changed = False
        for eos in eos_strings:
            if eos and tail.endswith(eos):
                tail = tail[: -len(eos)].rstrip()
                changed = True
    return tail


@cache
def template(name: str) -> str:
    """A prompt template of `prompts/`, read once."""
    return (PROMPTS_DIR / name).read_text(encoding="utf-8").strip()
