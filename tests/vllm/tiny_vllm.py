"""A tiny random Llama saved as a Hugging Face directory that vLLM's CPU build can load
(head_dim 64: the CPU attention kernels do not take the main suite's head_dim 8)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from tests.helpers.tiny import tiny_tokenizer


def tiny_config(vocab_size: int, hidden: int = 128, layers: int = 2, positions: int = 1024) -> LlamaConfig:
    heads = hidden // 64
    return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
                       max_position_embeddings=positions, tie_word_embeddings=False)


def tiny_model(vocab_size: int, seed: int, hidden: int = 128, layers: int = 2, positions: int = 1024,
               logit_scale: float = 20.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(vocab_size, hidden, layers, positions)).float()
    with torch.no_grad():  # larger logits than the default init, so sampling is not near-uniform
        model.lm_head.weight.mul_(logit_scale)
    return model.eval()


def save_tiny(path: Path, seed: int, hidden: int = 128, layers: int = 2, positions: int = 1024,
              logit_scale: float = 20.0) -> Path:
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed, hidden, layers, positions, logit_scale)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load_tiny(path: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
