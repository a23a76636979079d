"""chat-tools: the model's own tool calling, through its chat template.

Tools are declared once, as JSON schemas, to `tokenizer.apply_chat_template(..., tools=...)`. An assistant turn
ends at the template's end-of-turn token; it either writes calls, in the model family's format (a parser of
`tool_parsers`, `rollout.chat_tools.parser`), or is the answer. The calls of a turn run concurrently and are
answered in order, as `role: "tool"` messages the template renders (`chat_renderer`: token-exact); a call that
cannot be read, names a tool the prompt does not offer, or has arguments its schema refuses is answered with
the reason (status `malformed`, never run) and fails the format check, as a malformed tag does in TAPO.

Format grammar, over the model's turns T_1 ... T_n (the trajectory's segments, split at the insertions):

    T_1 ... T_{n-1}: each writes at least one call, every call readable (and never the answer tool)
    T_n:             the answer: text without a call, non-empty, its answer `\\boxed{...}` if it boxes one, else
                     the whole turn; or, with `answer_tool` set, exactly one call of that tool whose `answer`
                     argument is a non-empty string

and no call of the whole response malformed (read, offered and matching its schema). Strictness adds nothing:
text around calls is the families' own style (Qwen writes a sentence before `<tool_call>`).

Departure from TAPO/ToRL: no grammar in the system prompt; the chat template teaches the format. The answer is
read from the model's own last turn (a tool message is never part of a segment), so a tool cannot answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import ClassVar

from transformers import PreTrainedTokenizerBase

from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols.answers import last_boxed
from pipeline.protocols.chat_renderer import ChatRenderer
from pipeline.protocols.chat_template import TemplateError
from pipeline.protocols.base import (MALFORMED, OUTPUT_MARK, ParsedCall, Renderer, SegmentEnd, ToolProtocol,
                                     strip_eos)
from pipeline.protocols.tool_parsers import PARSERS, RawCall
from pipeline.types import BUILTIN_SPECS, Problem, ToolName, ToolSpec, Trajectory

TEMPLATES_DIR = Path(__file__).parent / "templates"
UNREADABLE_CALL = "malformed_call"  # the tool of a call whose name is unreadable or not offered


class ChatToolsProtocol(ToolProtocol):
    """Calls in the model family's format, declared and answered through its chat template."""

    name = "chat-tools"
    tools: ClassVar[tuple[ToolName, ...]] = ()  # any tool of the registry, declared by its schema

    def __init__(self, options: ChatToolsConfig | None = None) -> None:
        self.options = options or ChatToolsConfig()
        self.parser = PARSERS[self.options.parser]

    @property
    def answer_spec(self) -> ToolSpec | None:
        """The declared answer tool (`answer_tool`), or None when the answer is a turn without a call."""
        if not self.options.answer_tool:
            return None
        parameters = {"type": "object", "additionalProperties": False, "required": ["answer"],
                      "properties": {"answer": {"type": "string", "description": "The final answer alone."}}}
        return ToolSpec(self.options.answer_tool, "Give your final answer. Call it once, when you are done.",
                        parameters)

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        return ()  # a turn ends at the template's end-of-turn token, after all of its calls

    def read_segment(self, text: str, tools: tuple[ToolName, ...], *, at_eos: bool = False) -> SegmentEnd:
        if not at_eos:
            return SegmentEnd()
        written = self.parser.parse(text)
        answer = self.options.answer_tool
        if not written or (answer and any(c.name == answer for c in written)):
            return SegmentEnd(answered=True)
        return SegmentEnd(tuple(self._parsed(c, tools) for c in written))

    def _parsed(self, call: RawCall, tools: tuple[ToolName, ...]) -> ParsedCall:
        if call.error is not None:
            offered = call.name if call.name in tools else UNREADABLE_CALL
            return ParsedCall(offered, call.source, call.error, MALFORMED)
        if call.name not in tools:
            return ParsedCall(UNREADABLE_CALL, call.source, f"unknown tool {call.name!r}; the tools are "
                              f"{sorted(tools)}", MALFORMED)
        return ParsedCall(call.name, json.dumps(call.arguments, ensure_ascii=False))  # checked by the renderer

    def wrap_output(self, output: str) -> str:
        return output  # a tool message's content; the template wraps it (chat_renderer)

    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        spec = BUILTIN_SPECS.get(tool)
        arguments = {spec.text_argument: call_input} if spec and spec.text_argument else json.loads(call_input)
        return self.parser.render([(tool, arguments)], thought)

    def render_answer(self, answer: str) -> str:
        if self.options.answer_tool:
            return self.parser.render([(self.options.answer_tool, {"answer": answer})], "")
        return f"The answer is \\boxed{{{answer}}}."

    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.options.system_prompt},
                {"role": "user", "content": problem.question}]

    def model_segments(self, trajectory: Trajectory) -> list[str] | None:
        return list(trajectory.segments) or [trajectory.text]

    def grammar_violation(self, model_text: str, *, strict: bool, eos_strings: tuple[str, ...]) -> str | None:
        *call_turns, final = model_text.split(OUTPUT_MARK)
        for k, turn in enumerate(call_turns, start=1):
            written = self.parser.parse(turn)
            if not written:
                return f"turn {k} was answered by tools but writes no call"
            bad = next((c for c in written if c.error is not None), None)
            if bad is not None:
                return f"malformed tool call in turn {k}: {bad.error}"
            if self.options.answer_tool in {c.name for c in written}:
                return f"turn {k} calls the answer tool {self.options.answer_tool!r} before the last turn"
        return self._answer_violation(strip_eos(final, eos_strings))

    def _answer_violation(self, final: str) -> str | None:
        written = self.parser.parse(final)
        if self.options.answer_tool:
            if len(written) != 1 or written[0].name != self.options.answer_tool:
                return f"the last turn is not one call of the answer tool {self.options.answer_tool!r}"
            if self._answer_argument(written[0]) is None:
                return "the answer tool's `answer` is not a non-empty string"
            return None
        if written:
            return "the last turn calls a tool instead of answering"
        return None if final.strip() else "empty final answer"

    def extract_answer(self, text: str) -> str | None:
        """The last turn's answer: the answer tool's argument, else its last `\\boxed{}`, else the turn itself."""
        final = text.rsplit(OUTPUT_MARK, 1)[-1]
        written = self.parser.parse(final)
        if self.options.answer_tool:
            calls = [c for c in written if c.name == self.options.answer_tool]
            return self._answer_argument(calls[-1]) if calls else None
        if written:
            return None
        boxed = last_boxed(final)
        return boxed if boxed is not None else (final.strip() or None)

    @staticmethod
    def _answer_argument(call: RawCall) -> str | None:
        answer = (call.arguments or {}).get("answer")
        return answer.strip() if isinstance(answer, str) and answer.strip() else None

    def bind(self, tokenizer: PreTrainedTokenizerBase, specs: Mapping[ToolName, ToolSpec],
             eos_ids: frozenset[int]) -> Renderer:
        source = template_source(self.options.template, tokenizer)
        try:
            return ChatRenderer(self, tokenizer, specs, eos_ids, source, parser=self.parser, answer=self.answer_spec)
        except TemplateError as err:  # name the template the run was given
            raise TemplateError(f"rollout.chat_tools.template {self.options.template or '(the tokenizer own)'!r}: "
                                f"{err}") from None


def template_source(option: str, tokenizer: PreTrainedTokenizerBase) -> str:
    """The Jinja source `rollout.chat_tools.template` names: the tokenizer's own (""), a packaged one, or a file."""
    if not option:
        if not tokenizer.chat_template:
            raise ValueError("rollout.chat_tools.template is empty but the tokenizer has no chat template; name one "
                             f"({', '.join(packaged_templates())}) or a Jinja file")
        return tokenizer.chat_template
    if option in packaged_templates():
        return _read(TEMPLATES_DIR / f"{option}.jinja")
    path = Path(option)
    if not path.is_file():
        raise ValueError(f"rollout.chat_tools.template {option!r} is neither a packaged template "
                         f"({', '.join(packaged_templates())}) nor a file")
    return _read(path)


def packaged_templates() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja")))


@cache
def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")
