"""Tag protocols: how a model calls tools, sees their output and gives its answer.

A protocol is a type chosen once from `rollout.protocol`; the rollout loop only asks it
for stop strings, to parse the segment the model just wrote, and to wrap a tool output.

- TAPO: `<think>`, `<search>q</search>`, `<code>py</code>`, tool output in
  `<response>...</response>`, final `<answer>...</answer>`.
- ToRL: fenced ```python blocks answered by ```output blocks; answer in `\\boxed{}`.
- Search-R1: `<search>` answered by `<information>`; answer in `<answer>`.

Departure from the anchors: they cut decoded text at the tool tag and re-tokenize it;
here parsing reads the text but the tokens stay exactly as sampled (see rollout.engine).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import ClassVar

from pipeline.types import Problem, ToolName

PROMPTS_DIR = Path(__file__).parent / "prompts"

# Which tools a problem type may use (TAPO gives fact questions search, computation code).
TOOLS_FOR_TYPE: dict[str, tuple[ToolName, ...]] = {
    "calculator": ("code",),
    "math": ("code",),
    "code": ("code",),
    "fact": ("search",),
    "multihop": ("search",),
    "complex": ("search", "code"),
}


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


class TagProtocol:
    """Shared logic for XML-tag protocols (TAPO, Search-R1)."""

    name: ClassVar[str]
    output_tag: ClassVar[str]
    call_tags: ClassVar[dict[str, ToolName]]  # tag -> tool

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        tags = [tag for tag, tool in self.call_tags.items() if tool in tools]
        return tuple(f"</{tag}>" for tag in tags) + ("</answer>",)

    def read_segment(self, text: str, tools: tuple[ToolName, ...]) -> SegmentEnd:
        """Classify a segment by the first stop string in it (the decoder stops right after it)."""
        found = [(text.find(stop), stop) for stop in self.stop_strings(tools) if stop in text]
        if not found:
            return SegmentEnd()
        pos, close = min(found)
        if close == "</answer>":
            return SegmentEnd(answered=True)
        tag = close[2:-1]
        tool = self.call_tags[tag]
        start = text.rfind(f"<{tag}>", 0, pos)
        if start < 0:
            return SegmentEnd(ParsedCall(tool, "", f"malformed call: '{close}' without '<{tag}>'"))
        body = text[start + len(tag) + 2 : pos].strip()
        if not body:
            return SegmentEnd(ParsedCall(tool, "", f"empty <{tag}> call"))
        return SegmentEnd(ParsedCall(tool, body))

    def wrap_output(self, output: str) -> str:
        return f"\n<{self.output_tag}>\n{output}\n</{self.output_tag}>\n"

    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        """How a well-formed call is written (the scripted SFT teacher writes these)."""
        tag = next(t for t, name in self.call_tags.items() if name == tool)
        return f"<think>{thought}</think>\n<{tag}>\n{call_input}\n</{tag}>"

    def render_answer(self, answer: str) -> str:
        return f"<answer>{answer}</answer>"

    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt(tools)},
            {"role": "user", "content": problem.question},
        ]

    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        raise NotImplementedError


_TAPO_RULES = {
    "search": "Search the web with <search>query</search> when you lack a fact.",
    "code": "Run Python with <code>...</code> for any calculation; print() the result.",
}
_TAPO_EXAMPLES = {
    "code": (
        "Question: What is 1234 * 5678?\n"
        "<think>I will compute it with Python.</think>\n<code>print(1234 * 5678)</code>\n"
        "<response>\n7006652\n</response>\n<answer>7006652</answer>"
    ),
    "search": (
        "Question: What is the capital of Australia?\n"
        "<think>I should look it up.</think>\n<search>capital of Australia</search>\n"
        "<response>\nDoc 1 (Title: Canberra) Canberra is the capital city of Australia.\n</response>\n"
        "<answer>Canberra</answer>"
    ),
}

_NO_TOOL_EXAMPLE = "Question: What is 2 + 2?\n<think>Easy.</think>\n<answer>4</answer>"


class TapoProtocol(TagProtocol):
    name = "tapo"
    output_tag = "response"
    call_tags = {"search": "search", "code": "code"}

    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        rules = [f"{i + 2}. {_TAPO_RULES[t]}" for i, t in enumerate(tools)]
        # One example per offered tool: a single example (once the last tool's) was copied verbatim by a
        # small model on questions that needed the other tool (`print(1234 * 5678)` for a fact question).
        shown = [_TAPO_EXAMPLES[t] for t in tools] or [_NO_TOOL_EXAMPLE]
        examples = ("Examples:\n" if len(shown) > 1 else "Example:\n") + "\n\n".join(shown)
        return _template("tapo.txt").format(tool_rules="\n".join(rules), n=len(tools) + 2, examples=examples)


class SearchR1Protocol(TagProtocol):
    name = "search-r1"
    output_tag = "information"
    call_tags = {"search": "search"}

    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        return _template("search_r1.txt")


class TorlProtocol:
    """ToRL: fenced python blocks; the engine answers each with a fenced output block."""

    name = "torl"
    _open = "```python"
    _close = "```"

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        # A closing fence ends a code block; the segment reader checks it closes a python block.
        return ("```\n",) if "code" in tools else ()

    def read_segment(self, text: str, tools: tuple[ToolName, ...]) -> SegmentEnd:
        start = text.rfind(self._open)
        stripped = text.rstrip()
        if "code" in tools and start >= 0 and stripped.endswith(self._close) and len(stripped) > start + len(self._open):
            body = stripped[start + len(self._open) : -len(self._close)].strip()
            if not body:
                return SegmentEnd(ParsedCall("code", "", "empty python block"))
            return SegmentEnd(ParsedCall("code", body))
        return SegmentEnd(answered=re.search(r"\\boxed\{", text) is not None)

    def wrap_output(self, output: str) -> str:
        return f"```output\n{output}\n```\n"

    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        return f"{thought}\n```python\n{call_input}\n```\n"

    def render_answer(self, answer: str) -> str:
        return f"The answer is \\boxed{{{answer}}}."

    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        return [{"role": "system", "content": _template("torl.txt")}, {"role": "user", "content": problem.question}]


Protocol = TapoProtocol | SearchR1Protocol | TorlProtocol
PROTOCOLS: dict[str, type[Protocol]] = {p.name: p for p in (TapoProtocol, SearchR1Protocol, TorlProtocol)}


def make_protocol(name: str) -> Protocol:
    return PROTOCOLS[name]()


def tools_for(problem: Problem, available: tuple[ToolName, ...]) -> tuple[ToolName, ...]:
    """The tools a prompt offers: those the problem type may use and the run provides."""
    return tuple(t for t in TOOLS_FOR_TYPE.get(problem.type, ()) if t in available)


@cache
def _template(name: str) -> str:
    return (PROMPTS_DIR / name).read_text(encoding="utf-8").strip()
