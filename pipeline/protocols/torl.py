"""ToRL: fenced ```python blocks answered by ```output blocks; the answer in `\\boxed{}`.

Format grammar: the model never writes a ```output fence; a complete, non-empty `\\boxed{...}`
appears after the last engine output, outside any open ```python fence. Strictness adds nothing
here: ToRL answers end in prose ("... is \\boxed{5}. I hope it is correct."), and what follows the
final box cannot change the answer (a code block after it would be run and then need a new box).
"""

from __future__ import annotations

import re

from pipeline.protocols.answers import last_boxed, last_boxed_span
from pipeline.protocols.base import OUTPUT_MARK, ParsedCall, ToolProtocol, SegmentEnd, Wrapper, template
from pipeline.protocols.reading import invalid_unicode
from pipeline.types import Problem, ToolName

_BOX_OPEN_RE = re.compile(r"\\boxed\{")


class TorlProtocol(ToolProtocol):
    """ToRL: fenced python blocks; the engine answers each with a fenced output block."""

    name = "torl"
    tools = ("code",)
    output = Wrapper("```output", "```")
    _open = "```python"
    _close = "```"

    def stop_strings(self, tools: tuple[ToolName, ...]) -> tuple[str, ...]:
        # A closing fence ends a code block; the segment reader checks it closes a python block.
        return ("```\n",) if "code" in tools else ()

    def read_segment(self, text: str, tools: tuple[ToolName, ...], *, at_eos: bool = False) -> SegmentEnd:
        if at_eos:  # calls and answers end at stop strings; an end of sequence ends the trajectory
            return SegmentEnd()
        start = text.rfind(self._open)
        stripped = text.rstrip()
        if "code" in tools and start >= 0 and stripped.endswith(self._close) and len(stripped) > start + len(self._open):
            body = stripped[start + len(self._open) : -len(self._close)].strip()
            if not body:
                return SegmentEnd((ParsedCall("code", "", "empty python block"),))
            bad = invalid_unicode(body)
            if bad is not None:  # no tool is given text it cannot encode
                return SegmentEnd((ParsedCall("code", "", f"malformed call: the python block holds {bad}"),))
            return SegmentEnd((ParsedCall("code", body),))
        return SegmentEnd(answered=_BOX_OPEN_RE.search(text) is not None)

    def wrap_output(self, output: str) -> str:
        return f"{self.output.opener}\n{output}\n{self.output.closer}\n"

    def render_call(self, tool: ToolName, call_input: str, thought: str) -> str:
        return f"{thought}\n{self._open}\n{call_input}\n{self._close}\n"

    def render_answer(self, answer: str) -> str:
        return f"The answer is \\boxed{{{answer}}}."

    def messages(self, problem: Problem, tools: tuple[ToolName, ...]) -> list[dict[str, str]]:
        return [{"role": "system", "content": template("torl.txt")}, {"role": "user", "content": problem.question}]

    def grammar_violation(self, model_text: str, *, strict: bool, eos_strings: tuple[str, ...]) -> str | None:
        if self.output.opener in model_text:
            return f"the model wrote a {self.output.opener} block itself (only the tool may)"
        final = model_text.rsplit(OUTPUT_MARK, 1)[-1]
        span = last_boxed_span(final)
        if span is None:
            return "no \\boxed{} answer after the last tool output"
        if not final[span[0] : span[1]].strip():
            return "empty \\boxed{}"
        openers = final.count(self._open, 0, span[0])
        if openers > final.count(self._close, 0, span[0]) - openers:
            return "the final \\boxed{} is inside an unclosed ```python block"
        return None

    def extract_answer(self, text: str) -> str | None:
        """The last `\\boxed{...}` (or `\\fbox{...}`), braces nested to any depth."""
        return last_boxed(text)
