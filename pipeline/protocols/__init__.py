"""Protocols: how a model calls tools, sees their output and gives its answer, one object each.

A protocol (`ToolProtocol`, base.py) owns all of its grammar: stop strings and segment reading for the
rollout engine, how a tool output is shown and a call or an answer written, the prompt that teaches
it, the format check's grammar over the model's own text, and answer extraction; its token side for a
tokenizer (`Renderer`, `bind`) builds the ids the engine appends. `protocol_for` resolves `rollout.protocol`
once; nothing outside this package asks which protocol is configured.

- tapo, tapo-no-think (TAPO without the think block), search-r1: XML tags (tags.py);
- torl: markdown fences, answer in `\\boxed{}` (torl.py);
- chat-tools: the model's own chat template and call format (chat_tools.py; its parsers per model family in
  tool_parsers.py, its token-exact rendering in chat_renderer.py and chat_template.py);
- answers.py: the `<answer>` and `\\boxed{}` readers they share with the math normaliser;
- reading.py: what every reader of the policy's text shares: the total, depth-bounded JSON decoder of calls and
  the check that no call hands a tool invalid Unicode. Every reader here is a total function, linear in its text:
  any string gets a value or a typed refusal (a malformed call, a format violation, no answer), never an exception.

Departure from the anchors: they cut decoded text at the tool tag and re-tokenize it;
here parsing reads the text but the tokens stay exactly as sampled (see rollout.engine).
"""

from __future__ import annotations

from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols.base import (MALFORMED, OUTPUT_MARK, Dialogue, ParsedCall, Renderer, SegmentEnd,
                                     TextRenderer, ToolProtocol, Wrapper)
from pipeline.protocols.chat_template import TemplateError
from pipeline.protocols.chat_tools import ChatToolsProtocol
from pipeline.protocols.tags import SearchR1Protocol, TagProtocol, TapoNoThinkProtocol, TapoProtocol
from pipeline.protocols.torl import TorlProtocol

# The tag protocols: stateless, one object each.
PROTOCOLS: dict[str, ToolProtocol] = {p.name: p for p in (TapoProtocol(), TapoNoThinkProtocol(), TorlProtocol(),
                                                           SearchR1Protocol())}
PROTOCOL_NAMES: tuple[str, ...] = (*PROTOCOLS, ChatToolsProtocol.name)  # what `rollout.protocol` may name

__all__ = [
    "MALFORMED",
    "OUTPUT_MARK",
    "PROTOCOLS",
    "PROTOCOL_NAMES",
    "ChatToolsProtocol",
    "Dialogue",
    "ParsedCall",
    "Renderer",
    "TemplateError",
    "TextRenderer",
    "ToolProtocol",
    "SearchR1Protocol",
    "SegmentEnd",
    "TagProtocol",
    "TapoNoThinkProtocol",
    "TapoProtocol",
    "TorlProtocol",
    "Wrapper",
    "protocol_for",
    "protocol_of",
]


def protocol_for(name: str, chat_tools: ChatToolsConfig | None = None) -> ToolProtocol:
    """The protocol named `name` (a `rollout.protocol` value; `chat-tools` configured by `chat_tools`, the
    `rollout.chat_tools` section); a ValueError names the known ones."""
    if name == ChatToolsProtocol.name:
        return ChatToolsProtocol(chat_tools)
    protocol = PROTOCOLS.get(name)
    if protocol is None:
        raise ValueError(f"unknown protocol {name!r}; expected one of {PROTOCOL_NAMES}")
    return protocol


def protocol_of(rollout: RolloutConfig) -> ToolProtocol:
    """The protocol a rollout section names, configured by it (`rollout.protocol`, `rollout.chat_tools`)."""
    return protocol_for(rollout.protocol, rollout.chat_tools)
