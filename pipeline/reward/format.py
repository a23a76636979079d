"""The format grammar of a response (TAPO Eq. 7: a wrong format scores -1), per protocol.

The rollout engine, not the model, inserts tool outputs (`<response>` for tapo,
`<information>` for search-r1, a ```output fence for torl). Only the text reaches the
scorer, so the engine's outputs are told apart from look-alikes the model wrote itself by
their content: `split_engine_outputs` finds, in order, the wrapper whose content shows the
k-th `ToolResult.output` (`shown_as`: equal after stripping, or exactly the engine's own
head...tail cut of a long output, `cut_middle`, or its placeholder for an empty one). The cut
is recomputed, never re-parsed: an output whose head already holds a `\n...\n` line is
still recognised. Anything else shaped like a
tool output is model-written, the reward hack the grammar forbids.

Grammar of the tag protocols (tapo, search-r1), over model text and engine outputs O:

    response := WS (think | call WS O)* answer WS EOS* WS
    think    := <think> TEXT </think>          call := <search> TEXT </search>
    answer   := <answer> TEXT+ </answer>                | <code> TEXT </code>   (tapo only)

where TEXT contains no protocol tag (tags are balanced and never nested), WS is
whitespace, and EOS are the configured end-of-sequence strings. So: exactly one non-empty
answer, after the last tool output, followed by nothing but EOS; every call is answered by
the next engine output; the model never writes the output tag. `lenient` strictness
(TAPO's code) also allows free text between blocks; every other rule stays.

Grammar of torl (markdown fences, answer in `\\boxed{}`): the model never writes a
```output fence; a complete, non-empty `\\boxed{...}` appears after the last engine output,
outside any open ```python fence. Strictness adds nothing here: ToRL answers end in prose
("... is \\boxed{5}. I hope it is correct."), and what follows the final box cannot change
the answer (a code block after it would be run and then need a new box).

Departure from TAPO's code: its check scans with `re.search`, so free text before and
between blocks passes, and a model-written `<response>` counts as a valid block (the
hack); its retry message even passes as tag blocks. Both are closed here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from pipeline.reward.extract import last_boxed_span
from pipeline.tools.shown import CUT_MARK, cut_at, cut_middle

__all__ = ["CUT_MARK", "FormatResult", "check_format", "cut_middle", "shown_as", "split_engine_outputs"]


@dataclass(frozen=True)
class FormatResult:
    """Whether the response follows the grammar; `reason` names the first violation."""

    ok: bool
    reason: str | None
    model_text: str  # the response without the engine's tool outputs


@dataclass(frozen=True)
class Wrapper:
    opener: str
    closer: str


WRAPPERS: dict[str, Wrapper] = {
    "tapo": Wrapper("<response>", "</response>"),
    "search-r1": Wrapper("<information>", "</information>"),
    "torl": Wrapper("```output", "```"),
}
CALL_TAGS: dict[str, tuple[str, ...]] = {"tapo": ("search", "code"), "search-r1": ("search",)}
_OUTPUT_MARK = "\x00"  # stands for an engine output inside the model text; no model emits NUL
def split_engine_outputs(text: str, protocol: str, outputs: Sequence[str]) -> tuple[list[str], str | None]:
    """Model segments around the engine outputs (len(outputs) + 1 of them), or an error."""
    wrapper = WRAPPERS[protocol]
    segments: list[str] = []
    pos = 0
    for k, output in enumerate(outputs):
        found = _find_wrapped(text, pos, wrapper, output.strip())
        if found is None:
            return [], f"tool output #{k + 1} is not in the text"
        start, stop = found
        segments.append(text[pos:start])
        pos = stop
    segments.append(text[pos:])
    return segments, None


def shown_as(content: str, output: str) -> bool:
    """Whether `content` (inside a wrapper) is how the engine shows the tool `output`.

    The engine shows the stripped output; an over-long one as `cut_middle(output, limit)`, whose
    length fixes the cut (2 * half + len(CUT_MARK) characters), so the content is compared with
    the very cut the engine made, whatever the output itself holds (its own `\n...\n` lines
    included); an empty one as a one-line placeholder (e.g. "[no output] ...").
    """
    content = content.strip()
    if content == output:
        return True
    if not output:
        return "\n" not in content and "<" not in content and len(content) <= 200
    half, odd = divmod(len(content) - len(CUT_MARK), 2)
    return half > 0 and not odd and len(output) > len(content) and content == cut_at(output, half)


def _find_wrapped(text: str, pos: int, wrapper: Wrapper, output: str) -> tuple[int, int] | None:
    """(start, end) of the first wrapper at or after pos whose content shows `output`.

    The output itself may contain the closing tag (hostile code can print `</response>`),
    so every closer after the opener is tried, nearest first.
    """
    start = text.find(wrapper.opener, pos)
    while start >= 0:
        body = start + len(wrapper.opener)
        close = text.find(wrapper.closer, body)
        while close >= 0:
            if shown_as(text[body:close], output):
                return start, close + len(wrapper.closer)
            close = text.find(wrapper.closer, close + 1)
        start = text.find(wrapper.opener, start + 1)
    return None


def check_format(
    text: str, protocol: str, outputs: Sequence[str], *, strict: bool = True, eos_strings: Sequence[str] = ()
) -> FormatResult:
    """Check `text` (the whole response, tool outputs included) against the protocol grammar."""
    if _OUTPUT_MARK in text:  # the mark must be ours alone, or a model could fake an output
        return FormatResult(False, "NUL character in the response", text)
    segments, error = split_engine_outputs(text, protocol, outputs)
    if error is not None:
        return FormatResult(False, error, text)
    model_text = _OUTPUT_MARK.join(segments)
    reason = (
        _check_torl(model_text)
        if protocol == "torl"
        else _check_tags(model_text, CALL_TAGS[protocol], WRAPPERS[protocol], strict, tuple(eos_strings))
    )
    return FormatResult(reason is None, reason, model_text.replace(_OUTPUT_MARK, "\n"))


@lru_cache(maxsize=8)
def _tag_lexer(call_tags: tuple[str, ...], output_tag: str) -> re.Pattern[str]:
    names = "|".join(("think", "answer", output_tag, *call_tags))
    return re.compile(rf"<(/?)({names})>|{_OUTPUT_MARK}")


def _strip_eos(tail: str, eos_strings: tuple[str, ...]) -> str:
    tail = tail.strip()
    changed = True
    while changed and tail:
        changed = False
        for eos in eos_strings:
            if eos and tail.endswith(eos):
                tail = tail[: -len(eos)].rstrip()
                changed = True
    return tail


def _check_tags(
    model_text: str, call_tags: tuple[str, ...], wrapper: Wrapper, strict: bool, eos: tuple[str, ...]
) -> str | None:
    """First grammar violation of a tag-protocol response, or None."""
    output_tag = wrapper.opener[1:-1]
    blocks: list[str] = []  # "think", a call tag, "answer", or "OUTPUT", in order
    open_tag: str | None = None
    open_end = 0
    last_end = 0
    for match in _tag_lexer(call_tags, output_tag).finditer(model_text):
        token = match.group(0)
        if token == _OUTPUT_MARK or match.group(2) == output_tag:
            if token != _OUTPUT_MARK:
                return f"the model wrote a <{output_tag}> tag itself (only the tool may)"
            if open_tag is not None:
                return f"unclosed <{open_tag}> before a tool output"
            blocks.append("OUTPUT")
        elif match.group(1) == "":  # opening tag
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
            blocks.append(open_tag)
            open_tag = None
        if strict and token == _OUTPUT_MARK and model_text[last_end : match.start()].strip():
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
    return "text after </answer>" if _strip_eos(tail, eos) else None


def _check_torl(model_text: str) -> str | None:
    if "```output" in model_text:
        return "the model wrote a ```output block itself (only the tool may)"
    final = model_text.rsplit(_OUTPUT_MARK, 1)[-1]
    span = last_boxed_span(final)
    if span is None:
        return "no \\boxed{} answer after the last tool output"
    if not final[span[0] : span[1]].strip():
        return "empty \\boxed{}"
    openers = final.count("```python", 0, span[0])
    if openers > final.count("```", 0, span[0]) - openers:
        return "the final \\boxed{} is inside an unclosed ```python block"
    return None
