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

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.protocols import MALFORMED, OUTPUT_MARK, ToolProtocol
from pipeline.tools.shown import CUT_MARK, cut_at, cut_middle, shown_text
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
    """Model segments around the engine outputs (len(outputs) + 1 of them), or an error.

    The k-th output is looked for in the first wrapper after the (k-1)-th alone: the model never writes a
    wrapper (every grammar refuses one anywhere in its text), so a wrapper before the engine's fails the check
    whatever it holds, and looking past it for a later match scanned every wrapper after every wrapper
    (quadratic in `<response>x</response>` pairs). One pass over the text.
    """
    wrapper = protocol.output
    segments: list[str] = []
    pos = 0
    for k, output in enumerate(outputs):
        start = text.find(wrapper.opener, pos)
        stop = -1 if start < 0 else _shown_until(text, start + len(wrapper.opener), wrapper.closer,
                                                 shown_text(output.strip()))
        if stop < 0:
            return [], f"tool output #{k + 1} is not in the text"
        segments.append(text[pos:start])
        pos = stop
    segments.append(text[pos:])
    return segments, None


def shown_as(content: str, output: str) -> bool:
    """Whether `content` (inside a wrapper) is how the engine shows the tool `output`.

    The engine shows the stripped output as valid text (`shown_text`); an over-long one as
    `cut_middle(output, limit)`, whose length fixes the cut (2 * half + len(CUT_MARK) characters), so the
    content is compared with the very cut the engine made, whatever the output itself holds (its own `\n...\n`
    lines included); an empty one as a one-line placeholder (e.g. "[no output] ...").
    """
    content, output = content.strip(), shown_text(output)
    if content == output:
        return True
    if not output:
        return "\n" not in content and "<" not in content and len(content) <= _PLACEHOLDER_MAX
    half, odd = divmod(len(content) - len(CUT_MARK), 2)
    return half > 0 and not odd and len(output) > len(content) and content == cut_at(output, half)


_PLACEHOLDER_MAX = 200  # the longest placeholder shown for an empty output
_SPACE_RE = re.compile(r"\s*+")  # str.strip's whitespace
# closers whose content could be a cut of the output (its head, the mark and its tail in place) compared in full;
# past this many the output is not found: only an output written to look cut at many places gets that far
_MAX_CUT_CANDIDATES = 16


def _shown_until(text: str, body: int, closer: str, output: str) -> int:
    """The end of the nearest `closer` after `text[body]` that ends a content showing `output` (`shown_as`), or
    -1. Linear: a content longer than any showing can be ends the search, and each closer before it is judged
    by the stripped content's length and a few characters, compared in full only for the one exact length
    and a bounded number of cut candidates."""
    space = _SPACE_RE.match(text, body)
    assert space is not None  # `\s*+` matches anywhere
    start = space.end()
    longest = max(len(output), _PLACEHOLDER_MAX)
    candidates = 0
    close = text.find(closer, body)
    while close >= 0:
        end = _stripped_end(text, start, close)
        size = end - start
        if size > longest:
            return -1
        verdict = _shows(text, start, end, output)
        if verdict is True:
            return close + len(closer)
        if verdict is None:  # a cut candidate that failed its full comparison
            candidates += 1
            if candidates > _MAX_CUT_CANDIDATES:
                return -1
        close = text.find(closer, close + 1)
    return -1


def _stripped_end(text: str, start: int, close: int) -> int:
    """Where `text[start:close]` ends once stripped of trailing whitespace (`start` when nothing is left)."""
    end = close
    while end > start and text[end - 1].isspace():
        end -= 1
    return max(end, start)


def _shows(text: str, start: int, end: int, output: str) -> bool | None:
    """Whether the stripped content `text[start:end]` shows `output` (`shown_as`); None for a cut candidate
    that was compared in full and failed (the caller bounds those)."""
    size = end - start
    if size == len(output):
        return text.startswith(output, start, end)
    if not output:
        return "\n" not in text[start:end] and "<" not in text[start:end] and size <= _PLACEHOLDER_MAX
    half, odd = divmod(size - len(CUT_MARK), 2)
    if half <= 0 or odd or size >= len(output) or not text.startswith(CUT_MARK, start + half):
        return False
    if text[start] != output[0] or text[end - 1] != output[-1]:
        return False
    if text.startswith(output[:half], start) and text.startswith(output[len(output) - half:], end - half, end):
        return True
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
