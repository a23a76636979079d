"""The token side of `chat-tools` for one tokenizer: prompts with the tools declared, calls checked against their
schemas, and each turn's tool messages appended exactly as the chat template renders them (`chat_template`).

Set up once per run (`ChatToolsProtocol.bind`), it refuses, before anything samples, a template that ignores the
`tools` it is given, does not close an assistant turn with an end-of-sequence token of the model, transforms
message contents, or does not render a conversation incrementally, and a tokenizer that does not decode a turn
back to its text (the template is given the decoded turn): a scripted probe conversation (reasoning, one call,
two calls in a turn, whitespace at a turn's ends, an answer) is replayed turn by turn and compared, as ids,
with the whole conversation rendered at once.

Each tool's argument schema is compiled here too, at set-up (`arguments.compile_arguments`): a schema that
cannot be used (invalid, unresolvable or cyclic references, a regex outside RE2) is refused before anything
samples, naming the tool and where it came from; a call's arguments are then checked in bounded time, and
whatever they hold is a refusal of that call, never an exception. The declarations (and every text the
template is given) are made valid Unicode, without NUL (the content placeholders' character), once here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from pipeline.protocols.arguments import compile_arguments
from pipeline.protocols.base import MALFORMED, Dialogue, ParsedCall, Renderer, SegmentEnd, ToolProtocol
from pipeline.protocols.chat_template import ChatTemplate, TemplateError
from pipeline.protocols.tokens import decode, encode_template_text, valid_json, valid_text
from pipeline.protocols.tool_parsers import ToolCallParser
from pipeline.types import Problem, ToolName, ToolSpec

PROBE_TOOL = ToolSpec("probe_lookup", "Look a word up.", {"type": "object", "properties": {"word": {"type": "string"}},
                                                          "required": ["word"]})


class ChatRenderer(Renderer):
    """chat-tools over one tokenizer and the run's tools (see the module docstring)."""

    def __init__(self, protocol: ToolProtocol, tokenizer: PreTrainedTokenizerBase, specs: Mapping[ToolName, ToolSpec],
                 eos_ids: frozenset[int], source: str, *, parser: ToolCallParser, answer: ToolSpec | None) -> None:
        # `protocol` is `chat_tools.ChatToolsProtocol`, which builds this; its parser and answer tool come as such
        self.protocol, self.tokenizer, self.parser = protocol, tokenizer, parser
        self.specs = dict(specs)
        if answer is not None and answer.name in self.specs:
            raise ValueError(f"rollout.chat_tools.answer_tool {answer.name!r} is also the name of a tool")
        self.template = ChatTemplate(tokenizer, source, eos_ids)
        self._schemas = {name: compile_arguments(spec) for name, spec in self.specs.items()}
        self._declared = {name: declared(spec) for name, spec in self.specs.items()}
        self._answer_declared = declared(answer) if answer is not None else None
        self._check_declares_tools()
        self._probe()
        self.template.prompt_ids([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                 self.declarations(tuple(self.specs)))  # every declaration renders (as text)

    def declarations(self, tools: Sequence[ToolName]) -> list[dict[str, Any]]:
        """The `tools=` of a prompt offering `tools` (and the answer tool, when there is one)."""
        answer = [self._answer_declared] if self._answer_declared is not None else []
        return [self._declared[t] for t in tools] + answer

    def start(self, problem: Problem, tools: tuple[ToolName, ...]) -> Dialogue:
        messages = self.protocol.messages(problem, tools)
        declared = self.declarations(tools)
        prompt = self.template.prompt_ids(messages, declared)
        system = self.template.prompt_ids(messages[:1], declared, add_generation_prompt=False)
        shared = len(system) if len(system) < len(prompt) and prompt[:len(system)] == system else 0
        return Dialogue(prompt, shared, tools, [dict(m) for m in messages])

    def read(self, dialogue: Dialogue, segment_ids: Sequence[int], tools: tuple[ToolName, ...],
             at_eos: bool) -> SegmentEnd:
        """At the template's end of turn, the turn's calls (checked against their schemas) or its answer. An
        end of sequence that is not the template's turn closer ends the trajectory: nothing renders after it."""
        if not at_eos or segment_ids[-1] != self.template.turn_end_id:
            return SegmentEnd()
        end = self.protocol.read_segment(self.turn_text(segment_ids), tools, at_eos=True)
        return SegmentEnd(tuple(self._checked(call) for call in end.calls), end.answered)

    def _checked(self, call: ParsedCall) -> ParsedCall:
        """A readable call of an offered tool, its arguments checked (and made valid Unicode: a lone surrogate
        written as a JSON escape reaches no tool); a text tool's call given its text. Total: arguments it cannot
        read or check refuse the call."""
        if call.error is not None:
            return call
        spec, schema = self.specs.get(call.tool), self._schemas.get(call.tool)
        if spec is None or schema is None:
            return ParsedCall(call.tool, call.input, f"unknown tool {call.tool!r}", MALFORMED)
        try:
            arguments = json.loads(call.input)
        except (ValueError, RecursionError) as err:
            return ParsedCall(call.tool, call.input, f"unreadable arguments for tool {call.tool!r}: "
                              f"{type(err).__name__}", MALFORMED)
        valid, error = schema.check(arguments)
        if error is not None:
            return ParsedCall(call.tool, valid_text(call.input),
                              f"invalid arguments for tool {call.tool!r}: {error}", MALFORMED)
        if spec.text_argument:
            return ParsedCall(call.tool, valid[spec.text_argument])
        return call if valid is arguments else ParsedCall(call.tool, json.dumps(valid, ensure_ascii=False))

    def reply(self, dialogue: Dialogue, segment_ids: Sequence[int], answered: Sequence[tuple[ParsedCall, str]]
              ) -> list[int]:
        turn = self.turn_text(segment_ids)
        results = [{"role": "tool", "name": call.tool, "content": valid_text(shown).replace("\x00", "\ufffd")}
                   for call, shown in answered]
        ids = self.template.reply_ids(dialogue.messages, turn, results, self.declarations(dialogue.tools))
        dialogue.messages += [{"role": "assistant", "content": turn}, *results]
        return ids

    def segment_ids(self, text: str, *, final: bool) -> list[int]:
        return encode_template_text(self.tokenizer, text) + [self.template.turn_end_id]  # every turn ends alike

    def turn_text(self, segment_ids: Sequence[int]) -> str:
        """The turn's text as the template receives it: the sampled ids before the turn closer, decoded."""
        return decode(self.tokenizer, list(segment_ids[:-1]))

    def _check_declares_tools(self) -> None:
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        declared = self.template.render(messages, [PROBE_TOOL.declaration()], add_generation_prompt=True)
        if PROBE_TOOL.name not in declared:
            raise TemplateError("the chat template ignores the tools it is given (a tool's name never appears in "
                                "the prompt); set rollout.chat_tools.template to one with tool support (e.g. hermes)")

    def _probe(self) -> None:
        """Replay a scripted conversation turn by turn and compare it with the whole of it rendered at once."""
        probe = _ProbeRenderer(self)
        dialogue = probe.start(Problem("probe", "What does 'probe' mean?", ("x",), "fact", "probe", "test"),
                               (PROBE_TOOL.name,))
        ids, sampled = list(dialogue.prompt_ids), {}
        parser = self.parser
        for turn, results in _probe_turns(parser):
            turn_ids = encode_template_text(self.tokenizer, turn) + [self.template.turn_end_id]
            if self.turn_text(turn_ids) != turn:  # the template would be given other text than was sampled
                raise TemplateError(f"the tokenizer does not decode a turn's ids back to its text ({turn[:40]!r} "
                                    f"decodes as {self.turn_text(turn_ids)[:40]!r}); chat-tools needs a lossless "
                                    "(byte-level) tokenizer")
            sampled[len(dialogue.messages)] = turn_ids[:-1]
            ids += turn_ids
            if results:
                calls = [(ParsedCall(PROBE_TOOL.name, "{}"), text) for text in results]
                ids += probe.reply(dialogue, turn_ids, calls)
            else:
                dialogue.messages.append({"role": "assistant", "content": turn})
        whole = self.template.conversation_ids(dialogue.messages, probe.declarations(dialogue.tools), sampled)
        if ids != whole[:len(ids)]:
            at = next((i for i, (a, b) in enumerate(zip(ids, whole)) if a != b), min(len(ids), len(whole)))
            raise TemplateError("the chat template renders a conversation differently turn by turn than at once, "
                                f"from token {at}: {self.tokenizer.decode(whole[at:at + 12])!r} at once, "
                                f"{self.tokenizer.decode(ids[at:at + 12])!r} turn by turn")


class _ProbeRenderer(ChatRenderer):
    """The renderer with the probe's tool declared (no checks of its own)."""

    def __init__(self, outer: ChatRenderer) -> None:
        self.protocol, self.tokenizer, self.template = outer.protocol, outer.tokenizer, outer.template
        self.parser = outer.parser
        self.specs = {PROBE_TOOL.name: PROBE_TOOL}
        self._schemas = {PROBE_TOOL.name: compile_arguments(PROBE_TOOL)}
        self._declared, self._answer_declared = {PROBE_TOOL.name: declared(PROBE_TOOL)}, outer._answer_declared


def _probe_turns(parser) -> list[tuple[str, list[str]]]:
    call = parser.render([(PROBE_TOOL.name, {"word": "probe"})], "I will look it up.")
    two = parser.render([(PROBE_TOOL.name, {"word": "a"}), (PROBE_TOOL.name, {"word": "b"})], "")
    return [
        ("<think>\nThe word is unusual.\n</think>\n\n" + call, ["probe: a test <|im_end|> of something"]),
        ("\n" + two + "\n", ["a: first", "  b: second\n"]),
        ("<think>\nI know it now.\n</think>\n\nIt means a test: \\boxed{a test}.", []),
    ]


def declared(spec: ToolSpec) -> dict[str, Any]:
    """The tool's declaration as every template is given it: valid Unicode, NUL shown as U+FFFD (NUL is the
    character of the content placeholders). Its depth is bounded by the schema's compilation."""
    return _without_nul(valid_json(spec.declaration()))


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value
