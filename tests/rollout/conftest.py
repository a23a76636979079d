"""Fixtures of the rollout tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.train import toy_task
from tests.train.toy_task import build_toy_model


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy task's cold-started model, its two programs answered in-process (no sandbox)."""
    async def sandbox_outputs(url: str, programs: list[str]) -> list[str]:
        return [str(eval(p.removeprefix("print(").removesuffix(")"))) for p in programs]  # noqa: S307 - the toy's two

    patch = pytest.MonkeyPatch()
    patch.setattr(toy_task, "_outputs", sandbox_outputs)
    try:
        return build_toy_model(tmp_path_factory.mktemp("toy"), "")
    finally:
        patch.undo()
