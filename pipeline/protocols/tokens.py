"""Text to token ids as the rollout needs it: what the policy did not sample is encoded as plain text, and a
chat-templated prompt keeps the template's own ids.

Shared by every protocol's token side (`Renderer`): the rollout engine, the SFT teacher and the prompt budget
encode through these, so a prompt or a tool output is the same ids wherever it is built.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase


class TemplateError(ValueError):
    """A chat template the rollout cannot render token-exactly, and why."""


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every special token id: the named ones and any added token marked special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return frozenset(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str, special_ids: frozenset[int] | None = None
                 ) -> list[int]:
    """Token ids of `text` read as plain text: a special token or chat-template role marker written in it
    (`<|im_end|>`, `<|im_start|>user`) is spelled out in ordinary tokens, never its special id. For what the
    policy did not sample (tool output, search passages, budget notices, error messages): a real end-of-turn
    id there would inject a turn boundary into the model's context, and the scorer, which decodes with
    `skip_special_tokens=True`, would no longer find the tool's output."""
    ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    leaked = (special_ids if special_ids is not None else special_token_ids(tokenizer)).intersection(ids)
    if leaked:
        raise ValueError(f"the tokenizer turned plain text into special token(s) {sorted(leaked)} even with "
                         "split_special_tokens=True; it cannot tokenize tool output safely")
    return ids


def encode_template_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Ids of text the chat template wrote itself: its turn markers are its special tokens."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def mark(k: int) -> str:
    """The placeholder of the k-th content in a rendering (NUL: no model, template or message writes it)."""
    return f"\x00{k}\x00"


def encode_marked(tokenizer: PreTrainedTokenizerBase, rendered: str, contents: Sequence[str | list[int]],
                  special_ids: frozenset[int] | None = None) -> list[int]:
    """Ids of a rendering whose k-th content was replaced by `mark(k)`: the template's text between the marks
    keeps the template's ids, each content is its plain-text ids (a string) or the given ids (what was sampled).
    A TemplateError when the rendering does not hold every mark exactly once, in order."""
    ids: list[int] = []
    rest = rendered
    for k, content in enumerate(contents):
        template_text, sep, rest = rest.partition(mark(k))
        if not sep or mark(k) in rest:
            raise TemplateError(f"the chat template did not render content #{k} exactly once, unchanged "
                             "(it transforms message contents: escapes, trims or repeats them)")
        ids += encode_template_text(tokenizer, template_text)
        ids += encode_plain(tokenizer, content, special_ids) if isinstance(content, str) else list(content)
    return ids + encode_template_text(tokenizer, rest)


def chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool
             ) -> list[int]:
    """The template's ids. A message that writes a special token (a question quoting `<|im_end|>`) is text
    like a tool's output: the template is rendered around placeholders and each content encoded as plain
    text (`encode_plain`), so it cannot open or close a turn. Other prompts keep the template's own ids."""
    specials = [tokenizer.convert_ids_to_tokens(i) for i in special_token_ids(tokenizer)]
    if not any(token and token in m["content"] for m in messages for token in specials):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    rendered = tokenizer.apply_chat_template([{**m, "content": mark(k)} for k, m in enumerate(messages)],
                                             add_generation_prompt=add_generation_prompt, tokenize=False)
    return encode_marked(tokenizer, rendered, [m["content"] for m in messages])
