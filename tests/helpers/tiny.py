"""Tiny in-process models and tokenizers (no downloads): a byte-level BPE tokenizer with a
chat template, a seeded random Llama, and `ScriptedLM`, a model double that writes a
scripted response segment by segment (for exercising the rollout loop's tool path)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.cache_utils import DynamicCache

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "<think>I will compute it with Python.</think> <code>print(6 * 7)</code> <response>\n42\n</response>",
    "<answer>42</answer> <search>capital of Australia</search> Doc 1 (Title: Canberra) the capital city.",
    "What is 1234 * 5678? Round your answer. The quick brown fox jumps over the lazy dog 0123456789.",
    "```python\nprint(1 + 1)\n```\n```output\n2\n```\n\\boxed{2} tool budget exhausted error Traceback",
]


def tiny_tokenizer(corpus: list[str] = CORPUS, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained in-process on `corpus`, with ChatML special tokens and template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(vocab_size: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(dtype)


@dataclass
class _Out:
    logits: torch.Tensor
    cache: DynamicCache


class ScriptedLM(torch.nn.Module):
    """Writes `segments[k]` after the k-th tool output, token by token, then EOS.

    The "KV cache" stores token ids, so the decoder's cache merging and row selection are
    exercised for real: a wrong merge feeds the script a wrong context and breaks the test.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, segments: list[str], output_open: str = "<response>",
                 output_close: str = "</response>\n") -> None:
        super().__init__()
        self.tok = tokenizer
        self.segments = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in segments]
        self.output_open, self.output_close = output_open, output_close
        self.header = "<|im_start|>assistant\n"
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
        self.contexts_seen: list[list[int]] = []

    def _next_token(self, context: list[int]) -> int:
        text = self.tok.decode(context)
        if self.header not in text:  # the prompts' shared system turn alone (prefilled once): logits go unread
            return self.tok.eos_token_id
        response = text[text.rfind(self.header) + len(self.header):]
        k = response.count(self.output_open)
        emitted = response[response.rfind(self.output_close) + len(self.output_close):] if k else response
        if k >= len(self.segments):
            return self.tok.eos_token_id
        seg = self.segments[k]
        for j in range(len(seg) + 1):
            if self.tok.decode(seg[:j]) == emitted:
                return seg[j] if j < len(seg) else self.tok.eos_token_id
        raise AssertionError(f"context diverged from the script: {emitted!r}")

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        ids = input_ids.float()[:, None, :, None]  # [B, 1, T, 1]
        keys = ids if cache is None else torch.cat([cache.layers[0].keys, ids], dim=2)
        logits = torch.full((input_ids.shape[0], 1, len(self.tok)), -1e4)
        for b in range(input_ids.shape[0]):
            real = keys[b, 0, :, 0][attention_mask[b].bool()].long().tolist()
            self.contexts_seen.append(real)
            logits[b, 0, self._next_token(real)] = 0.0
        return _Out(logits, DynamicCache(ddp_cache_data=[(keys, keys)]))
