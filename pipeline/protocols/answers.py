"""Reading a final answer out of text: the last `<answer>...</answer>`, the last `\\boxed{...}`.

The protocols compose these (`extract_answer`): tapo and search-r1 take the last `<answer>` and,
when it holds a `\\boxed{...}` (ARPO style), its last box; torl takes the last `\\boxed{...}` (or
`\\fbox{...}`), braces nested to any depth. The math normaliser and the data judges read boxes too.

Departures from the anchors: ToRL's regex handles three brace levels and strips a trailing
"}" by hand; here braces are matched by counting, to any depth. TAPO keeps only the last
100 characters of the answer; here the answer is kept whole (the verifiers bound their
own work). Search-R1 needs two `<answer>` matches because it decodes prompt + response;
we score the response alone, so the last one is taken.

These read whatever text they are given. The scorer gives them the model's own text
(`check_format(...).model_text`, tool outputs removed), so a tool output that contains
`<answer>` or `\\boxed{}` cannot answer for the model.
"""

from __future__ import annotations

import re

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_SPACE_RE = re.compile(r"\\boxed +([^\s$]+)")
_OPEN, _CLOSE = "<answer>", "</answer>"


def closing_braces(text: str) -> dict[int, int]:
    """For every `{` that is closed, the index of its `}`, skipping escaped braces; one pass, so finding the
    last box stays linear in the text (one scan per box was quadratic on a run of unclosed boxes)."""
    closing: dict[int, int] = {}
    open_at: list[int] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # `\{` and `\}` are literal braces, not grouping
            continue
        if ch == "{":
            open_at.append(i)
        elif ch == "}" and open_at:
            closing[open_at.pop()] = i
        i += 1
    return closing


def last_boxed_span(text: str) -> tuple[int, int] | None:
    """(start, end) of the content of the last complete `\\boxed{...}`; text[end] is its `}`."""
    boxes = list(_BOX_RE.finditer(text))
    if not boxes:
        return None
    closing = closing_braces(text)
    for match in reversed(boxes):
        close = closing.get(match.end() - 1)
        if close is not None:
            return match.end(), close
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` in `text` (nested braces allowed), else None.

    `\\boxed 5` (no braces, as some models write) is accepted when no braced box exists.
    """
    span = last_boxed_span(text)
    if span is not None:
        return text[span[0] : span[1]].strip()
    spaced = _BOX_SPACE_RE.findall(text)
    return spaced[-1].strip() if spaced else None


def last_answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>` block, stripped, else None."""
    # the blocks a lazy `<answer>(.*?)</answer>` finds, found with str.find: once an `<answer>` has no `</answer>`
    # after it, neither has any later one (the pattern scanned to the end from each: quadratic on repeated tags)
    last, pos = None, 0
    while (start := text.find(_OPEN, pos)) >= 0 and (end := text.find(_CLOSE, start + len(_OPEN))) >= 0:
        last, pos = text[start + len(_OPEN):end], end + len(_CLOSE)
    return last.strip() if last is not None else None
