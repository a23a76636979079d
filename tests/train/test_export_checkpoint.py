"""An intermediate single-process checkpoint exports to the same plain directory as the final model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.export import export_checkpoint
from pipeline.export import main as export_cli
from pipeline.train import run
from pipeline.training_run.folder import run_folder
from tests.train.test_lora import LORA
from tests.train.toy_task import build_direct_model, toy_config, write_params

pytestmark = pytest.mark.integration  # training runs and exports


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_direct_model(tmp_path_factory.mktemp("export") / "model")


@pytest.mark.parametrize("finetune", [None, LORA], ids=["full", "lora"])
def test_the_last_checkpoint_exports_as_the_final_model(tmp_path: Path, model_dir: Path, finetune: dict | None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's artifact store (./mlruns) goes under tmp_path
    cfg = toy_config(tmp_path, model_dir, steps=2, checkpoints__every=1, **({"finetune": finetune} if finetune else {}))
    run(cfg, {}, metrics_dir=tmp_path / "metrics")
    checkpoints = run_folder(cfg) / "checkpoints"
    final = load_file(tmp_path / "policy" / "model.safetensors")
    # step 1 through the command line, step 2 through the function
    monkeypatch.setattr(sys, "argv", ["export", "--params", str(write_params(cfg, tmp_path / "params.yaml")),
                                      str(checkpoints / "step-000001"), str(tmp_path / "step1")])
    export_cli()
    first = load_file(tmp_path / "step1" / "model.safetensors")
    step2 = export_checkpoint(checkpoints / "step-000002", tmp_path / "step2", cfg.train, cfg.model.dtype)
    last = load_file(step2 / "model.safetensors")
    assert sorted(last) == sorted(final) == sorted(first)  # plain parameter names, a LoRA adapter merged
    assert all(torch.equal(last[name], final[name]) for name in final)
    assert not all(torch.equal(first[name], final[name]) for name in final)  # step 2 trained on from step 1
    assert (tmp_path / "step1" / "tokenizer_config.json").is_file()


def test_a_directory_without_weights_is_refused_by_name(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "step-000009").mkdir()  # there, but not a checkpoint (one that is not there: test_run_folder.py)
    cfg = toy_config(tmp_path, model_dir)
    with pytest.raises(FileNotFoundError, match="step-000009: no model.safetensors"):
        export_checkpoint(tmp_path / "step-000009", tmp_path / "out", cfg.train, cfg.model.dtype)
