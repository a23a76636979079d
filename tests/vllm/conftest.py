"""vLLM backend tests. They need the `.venv-vllm` environment (scripts/setup_vllm.sh):

    .venv-vllm/bin/python -m pytest tests/vllm

Under the main environment (no vLLM) only `test_selection.py` is collected: it checks that
selecting `backend: vllm` there fails at once with a clear message.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
# without vLLM every test module here but test_selection.py needs it: ignore them all, new ones included
collect_ignore = [] if HAVE_VLLM else sorted(p.name for p in Path(__file__).parent.glob("test_*.py")
                                             if p.name != "test_selection.py")

# Small KV cache for the CPU build; set before vLLM starts its engine process.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.vllm.tiny_vllm import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="session")
def backend(tiny_dir: Path) -> Iterator[object]:
    from pipeline.rollout.backends.vllm import VLLMBackend

    with VLLMBackend(tiny_dir, max_batch=8, max_model_len=512, seed=0) as b:
        yield b


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model trained to call the code tool on `tests.vllm.scripted.PROBLEM` (see that module)."""
    from tests.vllm.scripted import train_scripted

    return train_scripted(tmp_path_factory.mktemp("scripted"))
