"""`dvc exp run -S key=value` rewrites params.yaml with DVC's YAML 1.2 writer; the stages must still read it."""

from __future__ import annotations

import shutil
from pathlib import Path

from dvc.utils.hydra import apply_overrides

from pipeline.config import load_config


def test_params_rewritten_by_exp_run_set_param_load_the_same(tmp_path: Path, repo_root: Path) -> None:
    original = load_config(repo_root / "params.yaml")
    rewritten = tmp_path / "params.yaml"
    shutil.copy(repo_root / "params.yaml", rewritten)
    apply_overrides(rewritten, ["train.optimizer.lr=3e-6"])  # what `dvc exp run -S train.optimizer.lr=3e-6` does to the file
    assert "kind: off" in rewritten.read_text()  # DVC writes the string unquoted (a YAML 1.1 false)
    loaded = load_config(rewritten)
    assert loaded.train.optimizer.lr == 3e-6
    assert loaded.reward.tepo.kind == original.reward.tepo.kind == "off"
    assert loaded.model_dump() | {"train": None} == original.model_dump() | {"train": None}
    assert loaded.train.optimizer.model_dump() | {"lr": None} == original.train.optimizer.model_dump() | {"lr": None}
    assert loaded.train.model_dump() | {"optimizer": None} == original.train.model_dump() | {"optimizer": None}
