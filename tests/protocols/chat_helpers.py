"""What the chat-tools tests share: the embedded SmolLM2 tokenizer dressed for each template family, a scripted
model that samples given ids turn by turn, and the conformance check (a whole conversation rendered at once,
tokenized by the definition, independently of the library's turn-by-turn path)."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache

from pipeline.model import embedded_gguf_path
from pipeline.rollout.episode import NO_OUTPUT
from pipeline.tools.shown import cut_middle
from pipeline.types import Trajectory
from tests.helpers.tiny import _Out

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Family:
    """A chat template family as the tests render it with the SmolLM2 tokenizer."""

    name: str
    template: str  # rollout.chat_tools.template: a packaged name or a file
    parser: str
    turn_end: str  # the end-of-sequence token closing an assistant turn
    resume: str  # the template text just before an assistant turn's content (after a tool result)
    specials: tuple[str, ...] = ()  # tokens the family's tokenizer has that SmolLM2's lacks


FAMILIES = {f.name: f for f in (
    Family("hermes", "hermes", "hermes", "<|im_end|>", "<|im_start|>assistant\n"),
    Family("chatml", str(TEMPLATES / "chatml_tools.jinja"), "hermes", "<|im_end|>", "<|im_start|>assistant\n"),
    Family("llama3", str(TEMPLATES / "llama3.jinja"), "llama3", "<|eot_id|>",
           "<|start_header_id|>assistant<|end_header_id|>\n\n",
           ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>")),
    Family("mistral", str(TEMPLATES / "mistral.jinja"), "mistral", "</s>", "[/TOOL_RESULTS]",
           ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]")),
)}
STRIPS_REASONING = TEMPLATES / "strips_reasoning.jinja"


@functools.cache
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The embedded SmolLM2-135M-Instruct tokenizer (read from its GGUF file once per session)."""
    gguf = embedded_gguf_path("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@functools.cache
def family_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer with the family's special tokens added, its turn closer as end of sequence."""
    family = FAMILIES[name]
    tok = smollm2_tokenizer()
    if family.specials:
        tok = copy.deepcopy(tok)
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in family.specials], special_tokens=True)
        tok.eos_token = family.turn_end
    return tok


def turn_end_id(name: str) -> int:
    return family_tokenizer(name).convert_tokens_to_ids(FAMILIES[name].turn_end)


class ChatScriptedLM(torch.nn.Module):
    """Samples, for the prompt it recognises, its script of turns: exact id lists (each ending with the turn
    closer), one turn per assistant turn of the conversation, whatever the tools answered in between.

    As `tests.helpers.tiny.ScriptedLM`, its "KV cache" holds the ids, so the decoder's cache handling is real."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, resume: str, eos_id: int,
                 scripts: list[tuple[list[int], list[list[int]]]]) -> None:
        super().__init__()
        self.vocab, self.eos_id, self.scripts = len(tokenizer), eos_id, scripts
        self.resume = tokenizer(resume, add_special_tokens=False)["input_ids"]
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = GenerationConfig(eos_token_id=eos_id)

    def _next_token(self, context: list[int]) -> int:
        known = [(p, s) for p, s in self.scripts if context[:len(p)] == p and len(context) >= len(p)]
        if not known:
            return self.eos_id  # the shared system turn alone (prefilled once): its logits go unread
        prompt, turns = max(known, key=lambda ps: len(ps[0]))
        pos = len(prompt)
        for k, turn in enumerate(turns):
            done = context[pos:pos + len(turn)]
            if len(context) - pos < len(turn):
                assert done == turn[:len(done)], f"context diverged from turn {k}"
                return turn[len(done)]
            assert done == turn, f"context diverged from turn {k}"
            pos = self._after_insertion(context, pos + len(turn), turns[k + 1] if k + 1 < len(turns) else [])
        return self.eos_id  # past the script: an empty turn

    def _after_insertion(self, context: list[int], start: int, next_turn: list[int]) -> int:
        """Where the next turn starts: the first place after the resume text from which the context follows it."""
        n = len(self.resume)
        for j in range(start + n, len(context) + 1):
            ahead = context[j:j + len(next_turn)]
            if context[j - n:j] == self.resume and ahead == next_turn[:len(ahead)]:
                return j
        raise AssertionError("no assistant turn resumes after the tool results")

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        ids = input_ids.float()[:, None, :, None]  # [B, 1, T, 1]
        keys = ids if cache is None else torch.cat([cache.layers[0].keys, ids], dim=2)
        logits = torch.full((input_ids.shape[0], 1, self.vocab), -1e4)
        for b in range(input_ids.shape[0]):
            real = keys[b, 0, :, 0][attention_mask[b].bool()].long().tolist()
            logits[b, 0, self._next_token(real)] = 0.0
        return _Out(logits, DynamicCache(ddp_cache_data=[(keys, keys)]))


def shown(output: str, ok: bool, limit: int) -> str:
    """A tool output as the engine shows it (cut to the limit; a placeholder for nothing)."""
    return cut_middle(output.strip() or (NO_OUTPUT if ok else "error"), limit).replace("\x00", "\ufffd")


def conversation(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase, messages: list[dict], eos_id: int,
                 limit: int) -> tuple[list[dict], dict[int, list[int]]]:
    """The finished conversation as chat messages read off the trajectory's spans: each assistant turn decoded
    (only to fill the template: its ids are kept apart, closer excluded, as `sampled`), each tool message the
    output the engine showed."""
    response, calls = list(trajectory.response_ids), trajectory.tool_calls
    messages, sampled = [dict(m) for m in messages], {}
    turn_spans = list(dict.fromkeys(c.call_span for c in calls))
    end = max((c.output_span[1] for c in calls), default=0)
    for span in [*turn_spans, (end, len(response))]:
        ids = response[span[0]:span[1]]
        content = ids[:-1] if ids and ids[-1] == eos_id else ids
        sampled[len(messages)] = content
        messages.append({"role": "assistant", "content": tokenizer.decode(content)})
        messages += [{"role": "tool", "name": c.tool, "content": shown(c.result.output, c.result.ok, limit)}
                     for c in calls if c.call_span == span]
    return messages, sampled


def whole_ids(tokenizer: PreTrainedTokenizerBase, source: str, messages: list[dict], tools: list[dict],
              sampled: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """The conversation rendered at once and tokenized by the definition: the template's text with its special
    tokens, each content as plain text, an assistant turn's content as its sampled ids. Also the loss mask that
    goes with it: 1 on sampled ids and on the turn closer that follows each (the model sampled it)."""
    marks = [f"\x01{k}\x01" for k in range(len(messages))]
    rendered = tokenizer.apply_chat_template([{**m, "content": mk} for m, mk in zip(messages, marks)],
                                             tools=tools or None, chat_template=source, tokenize=False)
    ids, mask, closer_next = [], [], False
    for k, message in enumerate(messages):
        text, rendered = rendered.split(marks[k], 1)
        piece = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids += piece
        mask += [1 if closer_next and i == 0 else 0 for i in range(len(piece))]
        if k in sampled:
            ids += sampled[k]
            mask += [1] * len(sampled[k])
        else:
            plain = tokenizer(message["content"], add_special_tokens=False, split_special_tokens=True)["input_ids"]
            ids += plain
            mask += [0] * len(plain)
        closer_next = k in sampled
    tail = tokenizer(rendered, add_special_tokens=False)["input_ids"] if rendered else []
    return ids + tail, mask + [1 if closer_next and i == 0 else 0 for i in range(len(tail))]
