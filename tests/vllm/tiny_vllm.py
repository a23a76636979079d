"""A tiny random Llama saved as a Hugging Face directory that vLLM's CPU build can load
(head_dim 64: the CPU attention kernels do not take the main suite's head_dim 8)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from tests.helpers.tiny import tiny_tokenizer


def tiny_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=1024,
                       tie_word_embeddings=False)


def tiny_model(vocab_size: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(vocab_size)).float()
    with torch.no_grad():  # larger logits than the default init, so sampling is not near-uniform
        model.lm_head.weight.mul_(20.0)
    return model.eval()


def save_tiny(path: Path, seed: int) -> Path:
    tok = tiny_tokenizer()
    model = tiny_model(len(tok), seed)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load_tiny(path: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
