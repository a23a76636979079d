"""How each model family writes tool calls in its own turn, read and written: one small parser per family.

A chat template declares the tools (`apply_chat_template(tools=...)`); the model answers a turn either with
text (its answer) or with calls in its family's format:

- hermes (Qwen2.5/Qwen3, Hermes, SmolLM3, the ChatML tool templates): one `<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>` block per call, after any text;
- llama3 (Llama 3.1-3.3 JSON tool calling): the whole turn is `{"name": ..., "parameters": {...}}`, after an
  optional `<|python_tag|>`; several calls are separated by `;`;
- mistral (Mistral v3 and later): `[TOOL_CALLS]` followed by a JSON list of `{"name": ..., "arguments": {...}}`.

A parser reads structure only: a call it cannot read (bad JSON, no name, arguments that are not an object, an
unclosed block, JSON nested deeper than `reading.MAX_JSON_DEPTH`, a string holding a lone surrogate) comes back
with its reason, and the chat-tools protocol answers it with that reason as the tool's output. Every family
decodes through `reading.read_json` and finds its blocks with `str.find`, so a parser is total and linear in the
turn, whatever the model writes. Which tools exist and what arguments they take is the schemas' business (`chat_tools`).
Adding a family: a subclass here with `family`, `parse` and `render`, and its name in `PARSERS` (the config's
`rollout.chat_tools.parser` takes it from there).

Departure from the anchors: verl's and vLLM's parsers drop a call they cannot read (the turn becomes an
answer) or raise; here every call the model meant to write is answered, malformed or not, and counted.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pipeline.protocols.reading import JSON_WHITESPACE, JsonRead, invalid_unicode, read_json


@dataclass(frozen=True)
class RawCall:
    """One call as the model wrote it: a name and its arguments, or why it cannot be read (`error`)."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None
    source: str = ""  # the call's text as written (shown in a malformed call's record)


class ToolCallParser(ABC):
    """Reads the calls of one assistant turn and writes calls as the family's models do."""

    family: ClassVar[str]
    arguments_key: ClassVar[str] = "arguments"

    @abstractmethod
    def parse(self, text: str) -> tuple[RawCall, ...]:
        """Every call the turn `text` writes, in order (none: the turn is an answer)."""

    @abstractmethod
    def render(self, calls: Sequence[tuple[str, dict[str, Any]]], thought: str) -> str:
        """A turn that writes `calls` (name, arguments) after `thought`, as the family's models write it."""

    def read_object(self, value: Any) -> RawCall:
        """A decoded JSON value as a call: an object with a string `name` and an object of arguments."""
        if not isinstance(value, dict):
            return RawCall(None, None, f"a tool call must be a JSON object, got {type(value).__name__}")
        name, arguments = value.get("name"), value.get(self.arguments_key, {})
        extra = sorted(set(value) - {"name", self.arguments_key})
        if not isinstance(name, str) or not name:
            return RawCall(None, None, "a tool call needs a \"name\" string")
        if not isinstance(arguments, dict):
            return RawCall(name, None, f"the \"{self.arguments_key}\" of a tool call must be a JSON object")
        if extra:
            return RawCall(name, None, f"unexpected key(s) {extra} in a tool call")
        return RawCall(name, arguments)

    def call_json(self, name: str, arguments: dict[str, Any]) -> str:
        return _written({"name": name, self.arguments_key: arguments})


class HermesParser(ToolCallParser):
    family = "hermes"
    opener, closer = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> tuple[RawCall, ...]:
        # the blocks `<tool_call>(.*?)</tool_call>` finds, found with str.find: once an opener has no closer after
        # it, no later one has (the pattern scanned to the end from each: quadratic in unclosed tags)
        calls: list[RawCall] = []
        outside: list[str] = []
        pos = 0
        while (start := text.find(self.opener, pos)) >= 0 and (
                end := text.find(self.closer, start + len(self.opener))) >= 0:
            outside.append(text[pos:start])
            calls.append(self._read(text[start + len(self.opener):end]))
            pos = end + len(self.closer)
        outside.append(text[pos:])
        tail = "".join(outside)
        if self.opener in tail:
            calls.append(RawCall(None, None, "a <tool_call> block is not closed with </tool_call>",
                                 tail[tail.find(self.opener):]))
        elif self.closer in tail:
            calls.append(RawCall(None, None, "</tool_call> without a <tool_call>", tail))
        return tuple(calls)

    def call_json(self, name: str, arguments: dict[str, Any]) -> str:
        # a string holding "</tool_call>" would end the block inside the call: "<\/" is the same JSON string (in
        # JSON "<" appears only inside strings, so the replacement touches nothing else)
        return super().call_json(name, arguments).replace(self.closer, self.closer.replace("/", "\\/", 1))

    def _read(self, body: str) -> RawCall:
        read = read_json(body)
        if read.error is None and body[read.end:].strip(JSON_WHITESPACE):
            read = JsonRead(None, read.end, "is not valid JSON: text after the call's object")
        call = self.read_object(read.value) if read.error is None else RawCall(None, None, f"the tool call {read.error}")
        return dataclasses.replace(call, source=body.strip())

    def render(self, calls: Sequence[tuple[str, dict[str, Any]]], thought: str) -> str:
        blocks = "\n".join(f"<tool_call>\n{self.call_json(name, args)}\n</tool_call>" for name, args in calls)
        return f"{thought}\n{blocks}" if thought else blocks


class Llama3Parser(ToolCallParser):
    family = "llama3"
    arguments_key = "parameters"
    python_tag = "<|python_tag|>"

    def parse(self, text: str) -> tuple[RawCall, ...]:
        tagged = text.strip().startswith(self.python_tag)
        body = text.strip().removeprefix(self.python_tag).strip()
        if not body.startswith("{"):  # prose is the answer; after the python tag a call was meant
            return (RawCall(None, None, f"{self.python_tag} must be followed by a JSON call", body),) if tagged else ()
        calls: list[RawCall] = []
        pos = 0
        while pos < len(body):
            read = read_json(body, pos)
            if read.error is not None:
                return (*calls, RawCall(None, None, f"the tool call {read.error}", body[pos:]))
            calls.append(dataclasses.replace(self.read_object(read.value), source=body[pos:read.end]))
            pos = _skip(body, read.end, JSON_WHITESPACE + ";")
        return tuple(calls)

    def read_object(self, value: Any) -> RawCall:
        if isinstance(value, dict) and "arguments" in value and "parameters" not in value:
            value = {("parameters" if k == "arguments" else k): v for k, v in value.items()}  # both are written
        return super().read_object(value)

    def render(self, calls: Sequence[tuple[str, dict[str, Any]]], thought: str) -> str:
        return "; ".join(self.call_json(name, args) for name, args in calls)  # the turn is the calls alone


class MistralParser(ToolCallParser):
    family = "mistral"
    marker = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[RawCall, ...]:
        if self.marker not in text:
            return ()
        body = text.split(self.marker, 1)[1].strip()
        read = read_json(body)
        if read.error is not None:
            return (RawCall(None, None, f"the [TOOL_CALLS] list {read.error}", body),)
        value = read.value
        if body[read.end:].strip():
            return (RawCall(None, None, "text after the [TOOL_CALLS] list", body),)
        if not isinstance(value, list) or not value:
            return (RawCall(None, None, "[TOOL_CALLS] must be followed by a non-empty JSON list of calls", body),)
        return tuple(dataclasses.replace(self.read_object(v), source=json.dumps(v, ensure_ascii=False)) for v in value)

    def render(self, calls: Sequence[tuple[str, dict[str, Any]]], thought: str) -> str:
        listed = _written([{"name": name, "arguments": args} for name, args in calls])
        return f"{thought}{self.marker} {listed}" if thought else f"{self.marker} {listed}"


def _written(value: Any) -> str:
    """`value` as JSON a model writes (characters as themselves), or with every non-ASCII character escaped when
    a string holds a lone surrogate, which no tokenizer encodes (the parser then refuses that call)."""
    text = json.dumps(value, ensure_ascii=False)
    return text if invalid_unicode(text) is None else json.dumps(value)


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


PARSERS: dict[str, ToolCallParser] = {p.family: p for p in (HermesParser(), Llama3Parser(), MistralParser())}
