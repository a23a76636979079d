"""Text to token ids as the rollout needs it: what the policy did not sample is encoded as plain text, and a
chat-templated prompt keeps the template's own ids.

Shared by every protocol's token side (`Renderer`): the rollout engine, the SFT teacher and the prompt budget
encode through these, so a prompt or a tool output is the same ids wherever it is built.

Every text reaches the tokenizer through here and is made valid Unicode first (`valid_text`): a lone surrogate
(`"\\ud83d"` in a call's JSON arguments, echoed by a tool) cannot be written in UTF-8, and a tokenizer given one
raises. It is shown as U+FFFD, as a decoder shows bytes that are no character: no text fails the rollout.

Text a template renders from data rather than writes itself (a tool's declared name, description and schema)
is plain text too (`DeclaredText`): a special-token string in it is hidden behind a placeholder while the
template renders, and encoded as plain text where the placeholder lands, so an MCP server whose description
writes `<|im_end|>` cannot close a turn in every prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from transformers import PreTrainedTokenizerBase

# Where a placeholder's sign is chosen, a character no text of the rendering holds: the private-use area, then
# plane 15's (a declaration would need 72,000 distinct private-use characters to use every one).
_PRIVATE_USE = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE))


class TemplateError(ValueError):
    """A chat template the rollout cannot render token-exactly, and why."""


def valid_text(text: str) -> str:
    """`text` as valid Unicode: each lone surrogate becomes U+FFFD (a surrogate pair written as two code points
    becomes its character). Linear in the text; the text itself when it is already valid."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def valid_json(value: Any) -> Any:
    """A JSON value with every string in it (object keys too) made valid (`valid_text`); the value itself when
    nothing changes. Recursive: its callers bound the depth first (arguments, declarations, messages)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        items = [(valid_json(k), valid_json(v)) for k, v in value.items()]
        changed = any(k is not k0 or v is not v0 for (k, v), (k0, v0) in zip(items, value.items()))
        return dict(items) if changed else value
    if isinstance(value, (list, tuple)):
        items = [valid_json(v) for v in value]
        return type(value)(items) if any(v is not v0 for v, v0 in zip(items, value)) else value
    return value


def valid_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with every string in them made valid (`valid_json`)."""
    return [valid_json(m) for m in messages]


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every special token id: the named ones and any added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return frozenset(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special_tokens: bool = False) -> str:
    """`tokenizer.decode` of one sequence of ids: a string (transformers annotates a batch's result too)."""
    return cast(str, tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def token_text(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str | None:
    """`convert_ids_to_tokens` of one id: its token string, or None (transformers annotates a batch's result too)."""
    return cast("str | None", tokenizer.convert_ids_to_tokens(token_id))


def render_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """`apply_chat_template(..., tokenize=False)`: the rendering as text (transformers annotates ids too)."""
    return cast(str, tokenizer.apply_chat_template(messages, tokenize=False, **kwargs))


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str, special_ids: frozenset[int] | None = None
                 ) -> list[int]:
    """Token ids of `text` read as plain text: a special token or chat-template role marker written in it
    (`<|im_end|>`, `<|im_start|>user`) is spelled out in ordinary tokens, never its special id. For what the
    policy did not sample (tool output, search passages, budget notices, error messages): a real end-of-turn
    id there would inject a turn boundary into the model's context, and the scorer, which decodes with
    `skip_special_tokens=True`, would no longer find the tool's output."""
    ids = list(tokenizer(valid_text(text), add_special_tokens=False, split_special_tokens=True)["input_ids"])
    leaked = (special_ids if special_ids is not None else special_token_ids(tokenizer)).intersection(ids)
    if leaked:
        raise ValueError(f"the tokenizer turned plain text into special token(s) {sorted(leaked)} even with "
                         "split_special_tokens=True; it cannot tokenize tool output safely")
    return ids


@dataclass(frozen=True)
class Hidden:
    """The placeholders of one rendering: `sign`, an index, `sign` stands for `strings[index]`."""

    sign: str
    strings: tuple[str, ...]

    def placeholder(self, k: int) -> str:
        return f"{self.sign}{k}{self.sign}"

    def split(self, text: str) -> list[str]:
        """Text, then (index, text) pairs: `re.split` around the placeholders."""
        return re.split(f"{re.escape(self.sign)}([0-9]+){re.escape(self.sign)}", text)

    def reveal(self, text: str) -> str:
        """`text` with each placeholder replaced by the string it stands for (what the template really renders)."""
        return "".join(p if i % 2 == 0 else self.strings[int(p)] for i, p in enumerate(self.split(text)))


def encode_template_text(tokenizer: PreTrainedTokenizerBase, text: str, hidden: Hidden | None = None) -> list[int]:
    """Ids of text the chat template wrote itself: its turn markers are its special tokens. With `hidden`, each
    placeholder of a declared special-token string in it is that string's plain-text ids (`DeclaredText`)."""
    if hidden is not None and hidden.sign in text:
        pieces = hidden.split(text)
        ids = encode_template_text(tokenizer, pieces[0])
        for k in range(1, len(pieces), 2):
            ids += encode_plain(tokenizer, hidden.strings[int(pieces[k])])
            ids += encode_template_text(tokenizer, pieces[k + 1])
        return ids
    return list(tokenizer(valid_text(text), add_special_tokens=False)["input_ids"]) if text else []


class DeclaredText:
    """A tokenizer's special-token strings, and how to hide them in declared text (tool declarations, a tool
    message's name) while a template renders it: each whole occurrence becomes a placeholder whose sign is a
    private-use character no text of the rendering holds (it survives `tojson` and any filter that keeps text);
    `encode_template_text` encodes the placeholder as the string's plain-text ids. A template that does not
    render a placeholder as it is (it escapes it) is caught by comparing the revealed rendering with the real one
    (`ChatTemplate`)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, special_ids: frozenset[int]) -> None:
        strings = {token_text(tokenizer, i) for i in special_ids}
        self.strings = tuple(sorted((s for s in strings if s), key=lambda s: (-len(s), s)))  # longest match first
        self._index = {s: k for k, s in enumerate(self.strings)}
        self._find = re.compile("|".join(map(re.escape, self.strings))) if self.strings else None

    def holds_any(self, value: Any) -> bool:
        """Whether a special-token string occurs in a string of `value` (object keys too)."""
        return self._find is not None and any(self._find.search(s) for s in json_strings(value))

    def hiding(self, texts: Iterable[str]) -> Hidden:
        """Placeholders whose sign occurs in none of `texts` (every text the rendering is made of)."""
        used: set[str] = set()
        for text in texts:
            used.update(text)
        sign = next((chr(c) for block in _PRIVATE_USE for c in block if chr(c) not in used), None)
        if sign is None:
            raise TemplateError("no private-use character is free to stand for declared special-token text")
        return Hidden(sign, self.strings)

    def hide(self, value: Any, hidden: Hidden) -> Any:
        """`value` with each special-token string in its strings (object keys too) replaced by its placeholder."""
        if isinstance(value, str):
            return self._find.sub(lambda m: hidden.placeholder(self._index[m[0]]), value) if self._find else value
        if isinstance(value, dict):
            return {self.hide(k, hidden): self.hide(v, hidden) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.hide(v, hidden) for v in value)
        return value


def json_strings(value: Any) -> Iterable[str]:
    """Every string of a JSON value, object keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from json_strings(k)
            yield from json_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from json_strings(v)


def mark(k: int) -> str:
    """The placeholder of the k-th content in a rendering (NUL: no model, template or message writes it)."""
    return f"\x00{k}\x00"


def encode_marked(tokenizer: PreTrainedTokenizerBase, rendered: str, contents: Sequence[str | Sequence[int]],
                  special_ids: frozenset[int] | None = None, hidden: Hidden | None = None) -> list[int]:
    """Ids of a rendering whose k-th content was replaced by `mark(k)`: the template's text between the marks
    keeps the template's ids (a declared special-token string behind one of `hidden`'s placeholders is plain
    text), each content is its plain-text ids (a string) or the given ids (what was sampled).
    A TemplateError when the rendering does not hold every mark exactly once, in order."""
    ids: list[int] = []
    rest = rendered
    for k, content in enumerate(contents):
        template_text, sep, rest = rest.partition(mark(k))
        if not sep or mark(k) in rest:
            raise TemplateError(f"the chat template did not render content #{k} exactly once, unchanged "
                             "(it transforms message contents: escapes, trims or repeats them)")
        ids += encode_template_text(tokenizer, template_text, hidden)
        ids += encode_plain(tokenizer, content, special_ids) if isinstance(content, str) else list(content)
    return ids + encode_template_text(tokenizer, rest, hidden)


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool
             ) -> list[int]:
    """The template's ids. A message that writes a special token (a question quoting `<|im_end|>`) is text
    like a tool's output: the template is rendered around placeholders and each content encoded as plain
    text (`encode_plain`), so it cannot open or close a turn. Other prompts keep the template's own ids."""
    messages = valid_messages(messages)
    specials = [token_text(tokenizer, i) for i in special_token_ids(tokenizer)]
    if not any(token and token in m["content"] for m in messages for token in specials):
        # a list of ids, or a BatchEncoding that holds them (by transformers version)
        ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    rendered = render_text(tokenizer, [{**m, "content": mark(k)} for k, m in enumerate(messages)],
                           add_generation_prompt=add_generation_prompt)
    return encode_marked(tokenizer, rendered, [m["content"] for m in messages])
