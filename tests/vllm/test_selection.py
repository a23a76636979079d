"""Selecting `rollout.backend: vllm` where vLLM is not installed fails at once, clearly.

Runs in the main environment (no vLLM); skipped inside `.venv-vllm`, where the backend's
own tests run instead."""

from __future__ import annotations

import importlib.util

import pytest

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.engine import RolloutEngine
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_engine_with_backend_vllm_raises_clear_error() -> None:
    tok = tiny_tokenizer()
    with pytest.raises(ImportError, match=r"rollout.backend is 'vllm'.*setup_vllm.sh") as err:
        RolloutEngine(tiny_llama(len(tok)), tok, {}, RolloutConfig(backend="vllm"))
    assert type(err.value).__name__ == "VLLMUnavailable"

