"""What every reader of the policy's text shares: a total, depth-bounded JSON decoder and the Unicode check.

A reader of text the policy wrote is a total function of bounded cost: for any string it returns a value or a
typed refusal, never an exception, in time linear in the text. Two things in the standard library are not:
- `json` recurses once per level of `[` and `{`, so a call nested ~1,000 levels deep raised `RecursionError`
  (out of the parser, through the rollout); it also raises `ValueError` on an integer of more than 4,300 digits
  and reads `NaN`, `Infinity` and `1e999` as floats no JSON writer can write back;
- a decoded string may hold lone surrogates (`"\\ud83d"`), which no UTF-8 writer (tokenizer, HTTP client, tool
  process) can encode.
`read_json` refuses all of these with a reason, and `invalid_unicode` names a lone surrogate in any text, so a
call that holds one is refused as malformed where it is read and no invalid text reaches a tool.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# Levels of `[` and `{` in one call's JSON, the call object (and a list of calls) included. Arguments nest a few
# levels; every later reader of them (the schema validator, `json.dumps`, a tool) recurses per level too.
MAX_JSON_DEPTH = 32
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# what changes the nesting depth: brackets, and strings taken whole (an unclosed one to the end of the text, so
# that a run of them is scanned once)
_STRUCTURE_RE = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.DOTALL)
JSON_WHITESPACE = " \t\n\r"  # what JSON counts as whitespace (str.strip takes more)


@dataclass(frozen=True)
class JsonRead:
    """One JSON value read from a text: the value and where it ends, or why there is none (`error`, a predicate:
    "is not valid JSON: ...", "is nested too deeply ...", "holds invalid Unicode: ...")."""

    value: Any
    end: int
    error: str | None = None


class _Refused(ValueError):
    """A JSON constant or number that no JSON writer writes back (raised inside the decoder's hooks)."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} is too large for a JSON number")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def read_json(text: str, pos: int = 0) -> JsonRead:
    """The JSON value that starts at `text[pos]` (after whitespace), as `json.JSONDecoder.raw_decode` reads it,
    or a refusal: not JSON, nested deeper than `MAX_JSON_DEPTH`, a number no JSON writer writes (`NaN`,
    `1e999`, an integer past Python's digit limit), or a string holding a lone surrogate. Never raises; linear
    in the text it reads."""
    while pos < len(text) and text[pos] in JSON_WHITESPACE:
        pos += 1
    if _depth_exceeded(text, pos, MAX_JSON_DEPTH):
        return JsonRead(None, pos, f"is nested too deeply (more than {MAX_JSON_DEPTH} levels of [ and {{)")
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except ValueError as err:  # JSONDecodeError, a refused number, the integer digit limit
        return JsonRead(None, pos, f"is not valid JSON: {err}")
    bad = _invalid_string(value)
    if bad is not None:
        return JsonRead(None, pos, f"holds {bad}")
    return JsonRead(value, end)


def _depth_exceeded(text: str, pos: int, limit: int) -> bool:
    """Whether the value at `text[pos]` opens more than `limit` levels before it closes (scanned only as far as
    the decoder would read: to where the value closes)."""
    if pos >= len(text) or text[pos] not in "[{":
        return False  # a scalar: the decoder does not recurse
    depth = 0
    for match in _STRUCTURE_RE.finditer(text, pos):
        ch = text[match.start()]
        if ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
            if depth <= 0:
                return False
    return False


def _invalid_string(value: Any) -> str | None:
    """Why a decoded value cannot be written as valid text (a lone surrogate in a key or a string), or None.
    Iterative; the value is already depth-bounded."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            bad = invalid_unicode(item)
            if bad is not None:
                return bad
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def invalid_unicode(text: str) -> str | None:
    """Why `text` is no valid Unicode (it holds a lone surrogate, which no UTF-8 writer can encode), or None."""
    found = _SURROGATE_RE.search(text)
    if found is None:
        return None
    return f"invalid Unicode: a lone surrogate (U+{ord(found.group()):04X})"
