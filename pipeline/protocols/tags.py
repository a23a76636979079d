"""The XML-tag protocols, TAPO and Search-R1: their calls, outputs, answers, prompts and format grammar.

- tapo: `<think>`, `<search>q</search>`, `<code>py</code>`, tool output in `<response>...</response>`,
  final `<answer>...</answer>`.
- tapo-no-think: tapo without the think block (TAPO Table 3's "w/o think" arm): the prompt, examples and
  cold-start traces hold no `<think>`, and a `<think>` the model writes anyway fails the format check.
- search-r1: `<search>` answered by `<information>`; answer in `<answer>`.

Format grammar (TAPO Eq. 7: a wrong format scores -1), over model text and engine outputs O:

    response := WS (think | call WS O)* answer WS EOS* WS     (tapo-no-think: no think)
    think    := <think> TEXT </think>          call := <search> TEXT </search>
    answer   := <answer> TEXT+ </answer>                | <code> TEXT </code>   (tapo only)

where TEXT contains no protocol tag (tags are balanced and never nested), WS is
whitespace, and EOS are the configured end-of-sequence strings. So: exactly one non-empty
answer, after the last tool output, followed by nothing but EOS; every call is answered by
the next engine output; the model never writes the output tag. `lenient` strictness
(TAPO's code) also allows free text between blocks; every other rule stays.

Departure from TAPO's code: its check scans with `re.search`, so free text before and
between blocks passes, and a model-written `<response>` counts as a valid block (the
hack); its retry message even passes as tag blocks. Both are closed here.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from functools import lru_cache
from typing import ClassVar

from pipeline.protocols.answers import last_answer_tag, last_boxed
from pipeline.protocols.base import OUTPUT_MARK, ParsedCall, SegmentEnd, ToolProtocol, Wrapper, strip_eos, template
from pipeline.protocols.reading import invalid_unicode
from pipeline.types import Problem, ToolName


class TagProtocol(ToolProtocol):
    """Shared logic for XML-tag protocols (TAPO, Search-R1): a subclass names its call tags and output."""

    call_tags: ClassVar[dict[str, ToolName]]  # tag -> tool
    thinks: ClassVar[bool] = True  # whether the grammar has the <think> block

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.tools = tuple(cls.call_tags.values())  # read off the call tags, so the two cannot disagree

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        tags = [tag for tag, tool in self.call_tags.items() if tool in tools]
        return tuple(f"</{tag}>" for tag in tags) + ("</answer>",)

    def read_segment(self, text: str, tools: tuple[ToolName, ...], *, at_eos: bool = False) -> SegmentEnd:
        """Classify a segment by the first stop string in it (the decoder stops right after it)."""
        if at_eos:  # calls and answers end at stop strings; an end of sequence ends the trajectory
            return SegmentEnd()
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
            return SegmentEnd((ParsedCall(tool, "", f"malformed call: '{close}' without '<{tag}>'"),))
        body = text[start + len(tag) + 2 : pos].strip()
        if not body:
            return SegmentEnd((ParsedCall(tool, "", f"empty <{tag}> call"),))
        bad = invalid_unicode(body)
        if bad is not None:  # no tool is given text it cannot encode
            return SegmentEnd((ParsedCall(tool, "", f"malformed call: the <{tag}> call holds {bad}"),))
        return SegmentEnd((ParsedCall(tool, body),))

    def wrap_output(self, output: str) -> str:
        return f"\n{self.output.opener}\n{output}\n{self.output.closer}\n"

    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        tag = next(t for t, name in self.call_tags.items() if name == tool)
        opening = f"<think>{thought}</think>\n" if self.thinks else ""
        return f"{opening}<{tag}>\n{call_input}\n</{tag}>"

    def render_answer(self, answer: str) -> str:
        return f"<answer>{answer}</answer>"

    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system_prompt(tools)},
            {"role": "user", "content": problem.question},
        ]

    @abstractmethod
    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        """The system turn: the grammar, with rules and examples for the offered tools."""

    def grammar_violation(self, model_text: str, *, strict: bool, eos_strings: tuple[str, ...]) -> str | None:
        return _check_tags(model_text, tuple(self.call_tags), self.output.opener[1:-1], strict, eos_strings,
                           thinks=self.thinks)

    def extract_answer(self, text: str) -> str | None:
        """The last `<answer>`'s content; when it holds a `\\boxed{...}` (ARPO style), its last box's."""
        answer = last_answer_tag(text)
        if answer is None:
            return None
        boxed = last_boxed(answer)
        return answer if boxed is None else boxed


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
    output = Wrapper("<response>", "</response>")
    call_tags = {"search": "search", "code": "code"}

    prompt_file: ClassVar[str] = "tapo.txt"

    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        rules = [f"{i + 2}. {_TAPO_RULES[t]}" for i, t in enumerate(tools)]
        # One example per offered tool: a single example (once the last tool's) was copied verbatim by a
        # small model on questions that needed the other tool (`print(1234 * 5678)` for a fact question).
        shown = [self.example(_TAPO_EXAMPLES[t]) for t in tools] or [self.example(_NO_TOOL_EXAMPLE)]
        examples = ("Examples:\n" if len(shown) > 1 else "Example:\n") + "\n\n".join(shown)
        return template(self.prompt_file).format(tool_rules="\n".join(rules), n=len(tools) + 2, examples=examples)

    def example(self, text: str) -> str:
        """An example as this protocol's grammar writes it."""
        return text


class TapoNoThinkProtocol(TapoProtocol):
    """TAPO without the think block: the ablation of TAPO Table 3 ("w/o think"), the tools and answer as tapo."""

    name = "tapo-no-think"
    thinks = False
    prompt_file = "tapo_no_think.txt"

    def example(self, text: str) -> str:
        return re.sub(r"<think>.*?</think>\n?", "", text)


class SearchR1Protocol(TagProtocol):
    name = "search-r1"
    output = Wrapper("<information>", "</information>")
    call_tags = {"search": "search"}

    def system_prompt(self, tools: tuple[ToolName, ...]) -> str:
        return template("search_r1.txt")


@lru_cache(maxsize=8)
def _tag_lexer(call_tags: tuple[str, ...], output_tag: str) -> re.Pattern[str]:
    names = "|".join(("think", "answer", output_tag, *call_tags))
    return re.compile(rf"<(/?)({names})>|{OUTPUT_MARK}")


def _check_tags(
    model_text: str, call_tags: tuple[str, ...], output_tag: str, strict: bool, eos: tuple[str, ...], *,
    thinks: bool = True,
) -> str | None:
    """First grammar violation of a tag-protocol response, or None."""
    blocks: list[str] = []  # "think", a call tag, "answer", or "OUTPUT", in order
    open_tag: str | None = None
    open_end = 0
    last_end = 0
    for match in _tag_lexer(call_tags, output_tag).finditer(model_text):
        token = match.group(0)
        if token == OUTPUT_MARK or match.group(2) == output_tag:
            if token != OUTPUT_MARK:
                return f"the model wrote a <{output_tag}> tag itself (only the tool may)"
            if open_tag is not None:
                return f"unclosed <{open_tag}> before a tool output"
            blocks.append("OUTPUT")
        elif match.group(1) == "":  # opening tag
            if match.group(2) == "think" and not thinks and open_tag is None:
                return "the model wrote a <think> block (this protocol has none)"
            if open_tag is not None:
                return f"<{match.group(2)}> nested inside <{open_tag}>"
            if strict and model_text[last_end : match.start()].strip():
                return f"text outside tags before <{match.group(2)}>"
            open_tag, open_end = match.group(2), match.end()
            continue
        else:  # closing tag
            if open_tag != match.group(2):
                return f"</{match.group(2)}> without a matching <{match.group(2)}>"
            if open_tag == "answer" and not model_text[open_end : match.start()].strip():
                return "empty <answer>"
            blocks.append(match.group(2))  # the open tag's name, checked above
            open_tag = None
        if strict and token == OUTPUT_MARK and model_text[last_end : match.start()].strip():
            return "text outside tags before a tool output"
        last_end = match.end()
    if open_tag is not None:
        return f"unclosed <{open_tag}>"
    return _check_block_order(blocks, call_tags) or _check_tail(model_text[last_end:], eos)


def _check_block_order(blocks: list[str], call_tags: tuple[str, ...]) -> str | None:
    if blocks.count("answer") != 1:
        return "no <answer>" if "answer" not in blocks else "more than one <answer>"
    if blocks[-1] != "answer":
        return "the <answer> is not the last block"
    for i, block in enumerate(blocks):
        if block in call_tags and (i + 1 >= len(blocks) or blocks[i + 1] != "OUTPUT"):
            return f"<{block}> call without a tool output after it"
        if block == "OUTPUT" and (i == 0 or blocks[i - 1] not in call_tags):
            return "tool output without a call before it"
    return None


def _check_tail(tail: str, eos: tuple[str, ...]) -> str | None:
    return "text after </answer>" if strip_eos(tail, eos) else None
