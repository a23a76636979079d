"""The generation backends a rollout samples with, chosen once by `rollout.backend`: `hf` (transformers,
continuous batching in-process, `hf.py`) or `vllm` (its own engine, `vllm.py`, imported only when selected).
Both give the rollout engine a decoder per rollout and take the trained weights through `update_weights`."""

from __future__ import annotations

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.rollout import RolloutConfig, vllm_logprobs_mode
from pipeline.rollout.backends.decoding import Backend
from pipeline.rollout.backends.hf import HFBackend


def make_backend(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig,
                 seed: int) -> Backend:
    """The generation backend named by `rollout.backend`; vLLM is imported only when selected
    (a missing install raises `VLLMUnavailable` naming the fix). The vllm backend loads the model
    from its directory (`model.name_or_path`) and takes new weights through `update_weights`."""
    if not cfg.generation.in_process:
        from pipeline.rollout.backends.vllm import VLLMBackend

        # no mode matches the update's log-probs: the update recomputes them (config.combinations refuses the
        # rest), so vLLM's processed ones serve, where None is no mode vLLM accepts
        mode = vllm_logprobs_mode(cfg.temperature, cfg.top_p) or "processed_logprobs"
        return VLLMBackend(model, max_batch=cfg.max_batch_sequences, max_model_len=cfg.max_total_tokens, seed=seed,
                           options=cfg.vllm, logprobs_mode=mode)
    return HFBackend(model, tokenizer, cfg)
