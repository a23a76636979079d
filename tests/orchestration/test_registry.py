"""MLflow model registry: register trained directories, move `champion` only on a better evaluation."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from pipeline.config.run import RunSection
from pipeline.tracking.registry import (ACCURACY_TAG, CHAMPION, MODEL_NAME, RegistryError, champion_dir, find_version,
                               log_and_register, model_digest, update_champion)
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture()
def run_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunSection:
    monkeypatch.chdir(tmp_path)  # the sqlite store puts its artifact folder beside the working directory
    return RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="registry-test")


def _model(path: Path, seed: int) -> Path:
    tok = tiny_tokenizer()
    tiny_llama(len(tok), seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _train_run(run_cfg: RunSection) -> str:
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    with mlflow.start_run(run_name="train") as run:
        return run.info.run_id


def test_register_evaluate_and_champion_moves_only_on_improvement(run_cfg: RunSection, tmp_path: Path) -> None:
    first, second, third = (_model(tmp_path / f"policy{i}", seed=i) for i in range(3))
    v1 = log_and_register(run_cfg, _train_run(run_cfg), first)
    v2 = log_and_register(run_cfg, _train_run(run_cfg), second)
    v3 = log_and_register(run_cfg, _train_run(run_cfg), third)
    assert [str(v.version) for v in (v1, v2, v3)] == ["1", "2", "3"]
    client = MlflowClient(run_cfg.tracking_uri)

    # A local directory is matched to its version by content; the first evaluation crowns it.
    decision = update_champion(run_cfg, str(first), 0.40)
    assert decision.promoted and decision.version == "1" and decision.reason == "no champion yet"
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"

    # Worse, then equal: the alias stays, but the accuracy is recorded on the evaluated version.
    assert not update_champion(run_cfg, "models:/tapo-policy/2", 0.30).promoted
    assert client.get_model_version(MODEL_NAME, "2").tags[ACCURACY_TAG] == "0.3"
    tie = update_champion(run_cfg, str(third), 0.40)
    assert not tie.promoted and tie.previous_version == "1" and tie.previous_accuracy == pytest.approx(0.40)
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"

    # Better: the alias moves, and the champion resolves to that version's files.
    better = update_champion(run_cfg, "models:/tapo-policy/latest", 0.55)
    assert better.promoted and better.version == "3" and better.previous_version == "1"
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "3"
    local = champion_dir(run_cfg, cache_dir=tmp_path / "cache")
    assert (local / "config.json").is_file()
    assert model_digest(local) == model_digest(third) != model_digest(first)


def test_unregistered_model_changes_nothing(run_cfg: RunSection, tmp_path: Path) -> None:
    log_and_register(run_cfg, _train_run(run_cfg), _model(tmp_path / "registered", seed=0))
    stranger = _model(tmp_path / "stranger", seed=5)
    decision = update_champion(run_cfg, str(stranger), 0.99)
    assert not decision.promoted and decision.version is None
    assert find_version(run_cfg, "models:/other-model/1") is None
    with pytest.raises(RegistryError, match="no 'champion' alias"):
        champion_dir(run_cfg, cache_dir=tmp_path / "cache")


def test_clear_errors_for_bad_input(run_cfg: RunSection, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="no config.json"):
        log_and_register(run_cfg, _train_run(run_cfg), tmp_path)
    with pytest.raises(RegistryError, match="not found"):
        log_and_register(run_cfg, "0" * 32, _model(tmp_path / "m", seed=0))
