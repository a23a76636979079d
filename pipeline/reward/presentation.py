"""What every verifier reads: an answer as a reader sees it, without how it was typeset.

Answers and golds alike go through three rewrites before any kind compares them (`readable`):
1. Invisible format characters (Unicode category Cf: zero-width spaces and joiners, soft hyphens, byte-order and
   direction marks) are dropped: they change nothing a reader sees, but every comparison.
2. Digits of every script are read as ASCII digits (`٤٢`, `४२`, `４２`, `𝟒𝟐` are 42; Python's `float` reads them,
   the text kinds' normaliser and the number regexes did not), the Arabic decimal and thousands separators as
   `.` and `,`, and a typographic digit-group space (no-break, narrow no-break, thin, figure: `1 000 000`) is
   dropped between groups of three digits. A plain space is left alone: `1 2` may be two numbers.
3. Markup around the whole answer is taken off: markdown emphasis and code (`**42**`, `` `42` ``), LaTeX math
   delimiters (`$42$`, `\\(42\\)`, `\\[42\\]`), a box or a text/bold wrapper (`\\boxed{42}`, `\\textbf{42}`,
   `\\text{Paris}`), bare braces, and an answer label in front (`Answer: 42`, `**Final answer:** 42`,
   `The answer is: 42`, `= 42`), and one full stop, semicolon or comma that ends it (`**42**.`). Before this
   the same value scored differently per kind (math-verify read `\\mathbf{42}`, the calculator verifier did not;
   `**42**` scored 0 as math, 1 as complex).

Only markup around the whole answer goes: `$a$ or $b$` keeps its inner dollars (a wrapper is taken off only when
its closing marker is not also inside), so a hedge stays visible to `hedging.py`. Linear in the answer: the
wrappers are peeled by moving two indices, braces are matched in one pass.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import cache, partial

from pipeline.protocols.answers import closing_braces

# markdown and math-mode markers, taken off as equal runs at both ends (`_MarkerRuns`)
_MARKER_CHARS = "*_`$"
_DELIMITERS = (("\\[", "\\]"), ("\\(", "\\)"))
_WRAPPER_RE = re.compile(
    r"\\(?:boxed|fbox|text|textbf|textit|textrm|texttt|mathbf|mathrm|mathit|mathsf|mathtt|emph|mbox|bm)\s*\{|\{"
)
# `Answer: 42`, `**Final answer:** 42`, `**Answer**: 42`, `The answer is 42`, `= 42`
_LABEL = r"(?:the\s+)?(?:final\s+)?answer"
_LABEL_RE = re.compile(
    rf"(?P<bold>\*\*|__)\s*{_LABEL}\s*(?:(?P=bold)\s*[:：=]|[:：=]\s*(?P=bold)|\s+is\s*:?\s*(?P=bold))\s*"
    rf"|{_LABEL}(?:\s*[:：=]|\s+is\b\s*:?)\s*|=\s*",
    re.IGNORECASE,
)
_SENTENCE_END = frozenset(".;,。")
_NON_ASCII_DIGIT_RE = re.compile(r"(?![0-9])\d")
_ARABIC_SEPARATORS = str.maketrans({"\u066b": ".", "\u066c": ",", "\u066a": "%"})
# a digit group after a typographic group space, the head group without a leading zero (`0 100` is two numbers); the
# look-behinds start a match only at the head of a chain, so a long chain that fails at its end is scanned once
_GROUP_SPACES = "\u00a0\u2007\u2009\u202f"
_GROUPED_RE = re.compile(
    rf"(?<![0-9])(?<![0-9][{_GROUP_SPACES}])[1-9][0-9]{{0,2}}(?:[{_GROUP_SPACES}][0-9]{{3}})++(?![0-9])"
)
_GROUP_SPACE_TABLE = str.maketrans(dict.fromkeys(_GROUP_SPACES))


def visible(text: str) -> str:
    """`text` without invisible format characters (Unicode category Cf)."""
    return text if text.isascii() else "".join(ch for ch in text if unicodedata.category(ch) != "Cf")


def ascii_digits(text: str) -> str:
    """`text` with every decimal digit as an ASCII digit, Arabic separators as ASCII, digit groups joined."""
    if text.isascii():
        return text
    text = _NON_ASCII_DIGIT_RE.sub(lambda m: str(unicodedata.decimal(m.group())), text)
    text = text.translate(_ARABIC_SEPARATORS)
    return _GROUPED_RE.sub(lambda m: m.group().translate(_GROUP_SPACE_TABLE), text)


def unwrapped(text: str) -> str:
    """`text` without the markup around the whole of it (see the module); the text itself when there is none."""
    closing = cache(partial(closing_braces, text))  # one pass over the text, only if a wrapper opens it
    markers = _MarkerRuns(text)
    start, end = 0, len(text)
    while True:
        start, end = _skip_space(text, start, end)
        if end - start > 1 and text[end - 1] in _SENTENCE_END and text[end - 2] not in _SENTENCE_END:
            end -= 1  # `**42**.`, `\\boxed{42}.`; not an ellipsis (`1, 2, 3, ...` is another answer)
            continue
        label = _LABEL_RE.match(text, start, end)
        if label is not None and label.end() < end:
            start = label.end()
            continue
        inner = _inside_wrapper(text, start, end, closing) or markers.inside(start, end)
        if inner is None:
            return text[start:end]
        start, end = inner


def _skip_space(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _inside_wrapper(
    text: str, start: int, end: int, closing: Callable[[], dict[int, int]]
) -> tuple[int, int] | None:
    """(start, end) of what a brace wrapper or a math delimiter around text[start:end] holds, else None."""
    wrapper = _WRAPPER_RE.match(text, start, end)
    if wrapper is not None:
        brace = wrapper.end() - 1
        return (wrapper.end(), end - 1) if closing().get(brace) == end - 1 and wrapper.end() < end - 1 else None
    for opening, closing_marker in _DELIMITERS:
        inner_start, inner_end = start + len(opening), end - len(closing_marker)
        if (
            inner_start < inner_end
            and text.startswith(opening, start, end)
            and text.endswith(closing_marker, start, end)
            and text.find(closing_marker, inner_start, inner_end) == -1
        ):
            return inner_start, inner_end
    return None


class _MarkerRuns:
    """Peels equal runs of one marker (`**42**`, `$$42$$`) off both ends, when the marker does not also occur in
    the core (what lies inside every marker and space at both ends: `*__**42**__*` has core `42`, `$a$ or $b$`
    has `a$ or $b`). The core and what occurs in it are kept while the ends are peeled, so a long stack of
    markers costs one scan, not one per marker."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.core: tuple[int, int] | None = None
        self.occurs: dict[str, bool] = {}

    def inside(self, start: int, end: int) -> tuple[int, int] | None:
        text = self.text
        if start >= end:
            return None
        if self.core is None or start > self.core[0] or end < self.core[1]:
            core_start, core_end = start, end
            while core_start < end and (text[core_start] in _MARKER_CHARS or text[core_start].isspace()):
                core_start += 1
            while core_end > core_start and (text[core_end - 1] in _MARKER_CHARS or text[core_end - 1].isspace()):
                core_end -= 1
            self.core, self.occurs = (core_start, core_end), {}
        char, (core_start, core_end) = text[start], self.core
        if char not in _MARKER_CHARS or text[end - 1] != char or core_start >= core_end:
            return None
        if char not in self.occurs:
            self.occurs[char] = text.find(char, core_start, core_end) != -1
        head, tail = start, end
        while text[head] == char:
            head += 1
        while text[tail - 1] == char:
            tail -= 1
        if self.occurs[char] or head - start != end - tail:
            return None
        return head, tail


def readable(text: str) -> str:
    """What a verifier of any kind reads of an answer or a gold (see the module)."""
    return unwrapped(ascii_digits(visible(text)))
