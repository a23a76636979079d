"""The format check of a response (TAPO Eq. 7: a wrong format scores -1): the engine's outputs, then the grammar.

The rollout engine, not the model, inserts tool outputs (in the protocol's wrapper, `ToolProtocol.output`:
`<response>` for tapo, `<information>` for search-r1, a ```output fence for torl). Only the text
reaches the scorer, so the engine's outputs are told apart from look-alikes the model wrote itself by
their content: `split_engine_outputs` finds, in order, the wrapper whose content shows the
k-th `ToolResult.output` (`shown_as`: equal after stripping, or exactly the engine's own
head...tail cut of a long output, `cut_middle`, or its placeholder for an empty one). The cut
is recomputed, never re-parsed: an output whose head already holds a `\n...\n` line is
still recognised. Anything else shaped like a tool output is model-written, the reward hack the
grammar forbids.

What is left once the outputs are cut out (each replaced by `OUTPUT_MARK`) is checked against the
protocol's own grammar (`ToolProtocol.grammar_violation`; the grammars are written down in
`pipeline.protocols.tags` and `pipeline.protocols.torl`).

A protocol that reads turns (`chat-tools`: `ToolProtocol.model_segments`) needs no search: the model's
text between insertions is the trajectory's `segments`, recorded by the engine from the loss mask (the
template's own text around a tool message is no wrapper a model could forge into its sampled tokens). A
call it could not read or whose arguments its schema refused (status `malformed`) fails the check, as a
malformed tag does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.protocols import MALFORMED, OUTPUT_MARK, ToolProtocol, Wrapper
from pipeline.tools.shown import CUT_MARK, cut_at, cut_middle
from pipeline.types import Trajectory

__all__ = ["CUT_MARK", "FormatResult", "check_format", "check_response", "cut_middle", "shown_as",
           "split_engine_outputs"]


@dataclass(frozen=True)
class FormatResult:
    """Whether the response follows the grammar; `reason` names the first violation."""

    ok: bool
    reason: str | None
    # the response without the engine's tool outputs (a turn-reading protocol's turns joined by OUTPUT_MARK)
    model_text: str


def split_engine_outputs(text: str, protocol: ToolProtocol, outputs: Sequence[str]) -> tuple[list[str], str | None]:
    """Model segments around the engine outputs (len(outputs) + 1 of them), or an error."""
    wrapper = protocol.output
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
    text: str, protocol: ToolProtocol, outputs: Sequence[str], *, strict: bool = True, eos_strings: Sequence[str] = ()
) -> FormatResult:
    """Check `text` (the whole response, tool outputs included) against the protocol grammar."""
    if OUTPUT_MARK in text:  # the mark must be ours alone, or a model could fake an output
        return FormatResult(False, "NUL character in the response", text)
    segments, error = split_engine_outputs(text, protocol, outputs)
    if error is not None:
        return FormatResult(False, error, text)
    model_text = OUTPUT_MARK.join(segments)
    reason = protocol.grammar_violation(model_text, strict=strict, eos_strings=tuple(eos_strings))
    return FormatResult(reason is None, reason, model_text.replace(OUTPUT_MARK, "\n"))


def check_response(trajectory: Trajectory, protocol: ToolProtocol, *, strict: bool = True,
                   eos_strings: Sequence[str] = ()) -> FormatResult:
    """The format check of a trajectory, read as its protocol reads it: turn by turn (`model_segments`), or
    by finding the engine's outputs in the text (`check_format`)."""
    segments = protocol.model_segments(trajectory)
    if segments is None:
        outputs = [call.result.output for call in trajectory.tool_calls]
        return check_format(trajectory.text, protocol, outputs, strict=strict, eos_strings=eos_strings)
    model_text = OUTPUT_MARK.join(segments)
    if any(OUTPUT_MARK in s for s in segments):
        return FormatResult(False, "NUL character in the response", model_text)
    malformed = next((c for c in trajectory.tool_calls if c.result.status == MALFORMED), None)
    if malformed is not None:
        return FormatResult(False, f"malformed tool call: {malformed.result.error}", model_text)
    reason = protocol.grammar_violation(model_text, strict=strict, eos_strings=tuple(eos_strings))
    return FormatResult(reason is None, reason, model_text)
