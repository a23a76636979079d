"""Tag protocols: how a model calls tools, sees their output and gives its answer, one object each.

A protocol (`ToolProtocol`, base.py) owns all of its grammar: stop strings and segment reading for the
rollout engine, how a tool output is wrapped and a call or an answer written, the prompt that teaches
it, the format check's grammar over the model's own text, and answer extraction. `protocol_for`
resolves `rollout.protocol` once; nothing outside this package asks which protocol is configured.

- tapo, search-r1: XML tags (tags.py);
- torl: markdown fences, answer in `\\boxed{}` (torl.py);
- answers.py: the `<answer>` and `\\boxed{}` readers they share with the math normaliser.

Departure from the anchors: they cut decoded text at the tool tag and re-tokenize it;
here parsing reads the text but the tokens stay exactly as sampled (see rollout.engine).
"""

from __future__ import annotations

from pipeline.protocols.base import OUTPUT_MARK, ParsedCall, ToolProtocol, SegmentEnd, Wrapper
from pipeline.protocols.tags import SearchR1Protocol, TagProtocol, TapoProtocol
from pipeline.protocols.torl import TorlProtocol

PROTOCOLS: dict[str, ToolProtocol] = {p.name: p for p in (TapoProtocol(), TorlProtocol(), SearchR1Protocol())}

__all__ = [
    "OUTPUT_MARK",
    "PROTOCOLS",
    "ParsedCall",
    "ToolProtocol",
    "SearchR1Protocol",
    "SegmentEnd",
    "TagProtocol",
    "TapoProtocol",
    "TorlProtocol",
    "Wrapper",
    "protocol_for",
]


def protocol_for(name: str) -> ToolProtocol:
    """The protocol named `name` (a `rollout.protocol` value); a ValueError names the known ones."""
    protocol = PROTOCOLS.get(name)
    if protocol is None:
        raise ValueError(f"unknown protocol {name!r}; expected one of {tuple(PROTOCOLS)}")
    return protocol
