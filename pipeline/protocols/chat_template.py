"""A chat template rendered turn by turn, token-exact: what `chat-tools` appends after a call, and the set-up
checks that refuse a template it cannot render that way.

The rollout never re-tokenizes what the model sampled. After an assistant turn with calls, the ids appended
(loss mask 0) are the template's own rendering of the tool messages and of the next assistant header,
computed as the difference between the conversation rendered with them and without them:

    before = render(messages, add_generation_prompt=True)            # the context so far, as text
    after  = render(messages + [assistant(turn), *tools], add_generation_prompt=True)
    after  = before + turn + END + suffix                              # else: refused (the template drifts)

where `turn` is the decoded text of the sampled turn and END the text of the end-of-turn token the model
sampled (the template's own turn closer, a special token). `suffix` is tokenized with the template's special
tokens, each tool message's content as plain text (`encode_plain`, found through placeholders), so a tool that
prints `<|im_end|>` cannot close a turn. By induction the context's text is always the template's rendering
of the conversation, and its ids are the sampled ids verbatim plus the template's own tokenization of the
rest (`conversation_ids` checks a whole conversation against that definition).

Declared text is text (`tokens.DeclaredText`): a special-token string in a declaration (an MCP server's tool
description, schema or name) or in a tool message's name is rendered behind a placeholder and encoded as plain
text, so only the template's own markup yields special ids; every rendering with such text is checked against
the real one (the placeholders revealed), so a template that escapes them is refused, never mis-tokenized.
Every text is made valid Unicode before it is rendered (`tokens.valid_messages`).

A template that does not render incrementally (it drops earlier `<think>` blocks, trims or rewrites an
earlier turn, or renders a turn differently once it is not the last) would train on a context the model
never sees at inference: `ChatTemplate` probes it at set-up with a scripted conversation and raises
`TemplateError` naming what changed; a content-dependent drift the probe missed raises it at the turn
where it happens, never trains on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from pipeline.protocols.tokens import (DeclaredText, Hidden, TemplateError, encode_marked, json_strings, mark,
                                       render_text, special_token_ids, token_text, valid_json, valid_messages)

__all__ = ["ChatTemplate", "TemplateError"]

Message = dict[str, Any]


class ChatTemplate:
    """One chat template (source text) over one tokenizer, with the turn closer its assistant turns end with."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, source: str, eos_ids: frozenset[int]) -> None:
        self.tokenizer, self.source = tokenizer, source
        self._special_ids = special_token_ids(tokenizer)
        self._declared = DeclaredText(tokenizer, self._special_ids)
        self.turn_end_id, self.turn_end_text = self._turn_end(eos_ids)

    def render(self, messages: Sequence[Message], tools: Sequence[dict], add_generation_prompt: bool) -> str:
        try:
            return render_text(self.tokenizer, list(messages), tools=list(tools) or None, chat_template=self.source,
                               add_generation_prompt=add_generation_prompt)
        except Exception as err:  # jinja's own errors (a template's raise_exception too): name the template's fault
            raise TemplateError(f"the chat template failed to render a conversation: {type(err).__name__}: {err}"
                                ) from err

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict], add_generation_prompt: bool = True
                   ) -> list[int]:
        """The ids of `messages` rendered with `tools` declared; each content encoded as plain text."""
        return self.conversation_ids(messages, tools, {}, add_generation_prompt)

    def reply_ids(self, messages: Sequence[Message], turn: str, results: Sequence[Message], tools: Sequence[dict]
                  ) -> list[int]:
        """The ids after an assistant turn that sampled `turn` and then the turn closer: the tool messages
        `results` and the next assistant header, as the template renders them (see the module docstring)."""
        assistant = {"role": "assistant", "content": turn}
        messages, results = valid_messages(messages), valid_messages(results)
        view = self._view([*messages, assistant, *results], tools)
        shown, shown_tools = view.messages, view.tools
        before = self.render(shown[:len(messages)], shown_tools, add_generation_prompt=True)
        after = self.render(shown, shown_tools, add_generation_prompt=True)
        head = before + turn + self.turn_end_text
        if not after.startswith(head):
            raise TemplateError("the chat template does not render the conversation incrementally: with the "
                                f"tool results added it renders {_difference(head, after)}, so the tokens "
                                "sampled so far would not be the conversation it shows the model")
        marked = [{**m, "content": mark(k)} for k, m in enumerate(shown[len(messages) + 1:])]
        suffix = self.render([*shown[:len(messages) + 1], *marked], shown_tools, add_generation_prompt=True)[len(head):]
        ids = encode_marked(self.tokenizer, suffix, [m["content"] for m in results], self._special_ids, view.hidden)
        self._check_contents(suffix, results, after[len(head):])
        self._check_revealed(view, after, [*messages, assistant, *results], tools, add_generation_prompt=True)
        return ids

    def conversation_ids(self, messages: Sequence[Message], tools: Sequence[dict],
                         sampled: Mapping[int, Sequence[int]], add_generation_prompt: bool = False) -> list[int]:
        """A whole conversation rendered at once, as ids: message k's content is `sampled[k]` where given (an
        assistant turn: the ids the model sampled, its turn closer excluded), else its text encoded as plain
        text. What a trajectory built turn by turn must be a prefix of (it stops at its last turn closer)."""
        messages = valid_messages(messages)
        view = self._view(messages, tools)
        marked = [{**m, "content": mark(k)} for k, m in enumerate(view.messages)]
        rendered = self.render(marked, view.tools, add_generation_prompt)
        real = self.render(view.messages, view.tools, add_generation_prompt)
        self._check_contents(rendered, messages, real)
        self._check_revealed(view, real, messages, tools, add_generation_prompt)
        contents = [sampled[k] if k in sampled else m["content"] for k, m in enumerate(messages)]
        return encode_marked(self.tokenizer, rendered, contents, self._special_ids, view.hidden)

    def _view(self, messages: Sequence[Message], tools: Sequence[dict]) -> _View:
        """The messages and declarations as the template is given them: special-token strings in declared text
        (the declarations; a message's fields other than its role and content) behind placeholders."""
        declarations: list[dict] = valid_json(list(tools))
        declared = [{k: v for k, v in m.items() if k not in ("role", "content")} for m in messages]
        if not self._declared.holds_any([declarations, declared]):
            return _View(list(messages), declarations, None)
        hidden = self._declared.hiding([self.source, *json_strings([declarations, list(messages)])])
        shown = [{**m, **self._declared.hide(d, hidden)} for m, d in zip(messages, declared)]
        return _View(shown, self._declared.hide(declarations, hidden), hidden)

    def _check_revealed(self, view: _View, rendered: str, messages: Sequence[Message], tools: Sequence[dict],
                        add_generation_prompt: bool) -> None:
        """A rendering with hidden declared text, its placeholders revealed, is the real rendering: the template
        rendered every placeholder as it is (it did not escape or cut one), so each stands where its text does."""
        if view.hidden is None:
            return
        real = self.render(messages, valid_json(list(tools)), add_generation_prompt)
        revealed = view.hidden.reveal(rendered)
        if revealed != real:
            raise TemplateError("the chat template renders declared text (a tool's name, description or schema) "
                                f"other than as it is ({_difference(revealed, real)}); its special-token "
                                "strings could not be kept as plain text")

    def _check_contents(self, marked: str, messages: Sequence[Message], real: str) -> None:
        """The rendering with placeholders, each replaced by its content, is the real rendering."""
        filled = marked
        for k, m in enumerate(messages):
            filled = filled.replace(mark(k), m["content"], 1)
        if filled != real:
            raise TemplateError("the chat template renders a message's content differently from the content "
                                f"itself ({_difference(filled, real)}); it must render contents verbatim")

    def _turn_end(self, eos_ids: frozenset[int]) -> tuple[int, str]:
        """The end-of-sequence token the template closes an assistant turn with, and its text."""
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": mark(0)},
                 {"role": "user", "content": "v"}]
        rendered = self.render(probe, (), add_generation_prompt=False)
        if rendered.count(mark(0)) != 1:
            raise TemplateError("the chat template does not render an assistant turn's content verbatim, once "
                                "(it escapes, trims or repeats it), so the sampled tokens could not stand for it")
        after_turn = rendered.partition(mark(0))[2]
        for eos in sorted(eos_ids):
            text = token_text(self.tokenizer, eos)
            if eos in self._special_ids and text and after_turn.startswith(text):
                return eos, text
        names = sorted(filter(None, self.tokenizer.convert_ids_to_tokens(sorted(eos_ids))))
        raise TemplateError(f"the chat template closes an assistant turn with {after_turn[:40]!r}, which does not "
                            f"start with an end-of-sequence token of the model ({names}): the model could not end "
                            "a turn the way the template renders it")


@dataclass(frozen=True)
class _View:
    """What a rendering is given: the messages and declarations, declared special-token text hidden (`hidden`),
    or as they are (`hidden` None: no declared text holds one)."""

    messages: list[Message]
    tools: list[dict]
    hidden: Hidden | None


def _difference(expected: str, got: str) -> str:
    """Where `got` departs from `expected`, with a little context on each side."""
    at = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return f"{got[max(0, at - 30):at + 30]!r} where {expected[max(0, at - 30):at + 30]!r} was expected"
