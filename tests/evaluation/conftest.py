"""Fixtures of the evaluation tests: the tiny tokenizer, a saved tiny model, a config factory."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import RunConfig
from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.rollout import RolloutConfig
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tok) -> Path:
    """A random-weight Llama and the tiny tokenizer saved as a Hugging Face directory."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_llama(len(tok)).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def make_cfg(out_dir: Path, **evaluate) -> RunConfig:
    rollout = RolloutConfig(max_policy_tokens=48, max_total_tokens=1024, max_batch_sequences=8)
    return RunConfig(evaluate=EvaluateConfig(output_dir=str(out_dir), **evaluate), rollout=rollout)
