"""How the engine shows a tool output: the one definition the rollout (which inserts it) and the
scorer (which must recognise it, `pipeline.reward.format.shown_as`) share. No dependencies, so
both environments (the main one and vLLM's) import it.

What is shown is valid text (`shown_text`): a tool's output may hold what no tokenizer or HTTP client can
write (lone surrogates, from output decoded with `surrogateescape` or JSON's `\\ud83d`) and NUL, the scorer's
own mark for an engine output. Both are shown as U+FFFD, as a decoder shows bytes that are no character, before
the output is cut, so a cut never splits a surrogate pair and the scorer recomputes the very text shown.
"""

from __future__ import annotations

import re

CUT_MARK = "\n...\n"  # what the engine puts between the head and the tail of a cut tool output
_UNSHOWN_RE = re.compile("[\x00\ud800-\udfff]")


def shown_text(text: str) -> str:
    """`text` as valid Unicode without NUL: a surrogate pair written as two code points becomes its character,
    a lone surrogate or a NUL becomes U+FFFD. Linear; the text itself when there is nothing to change."""
    if _UNSHOWN_RE.search(text) is None:
        return text
    valid = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return valid.replace("\x00", "\ufffd")


def cut_middle(text: str, limit: int) -> str:
    """Keep head and tail of an over-long tool output (ToRL/TAPO show both ends), as `shown_text`; never longer
    than `limit` when it is cut."""
    text = shown_text(text)
    if len(text) <= limit:
        return text
    half = (limit - len(CUT_MARK)) // 2
    return cut_at(text, half) if half > 0 else text[:max(limit, 0)]


def cut_at(text: str, half: int) -> str:
    """`half` characters of each end of `text` around the cut mark."""
    return f"{text[:half]}{CUT_MARK}{text[max(len(text) - half, 0):]}"
