"""MLflow model registry: register trained directories as logged models, move `champion` only on a better
evaluation under the same setting (an incomparable one leaves it alone)."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
import yaml
from mlflow import MlflowClient

from pipeline.config.run import RunSection
from pipeline.tracking.registry import (ACCURACY_TAG, CHAMPION, DIGEST_TAG, LINEAGE_FILE, MODEL_NAME, TRAIN_RUN_TAG,
                                       RegistryError, champion_dir, find_version, log_and_register, model_digest,
                                       setting_key, update_champion)
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


# What the evaluate flow records (pipeline.evaluation.setting): same problems, samples, temperature, protocol, mode.
SETTING = {"split": "calculator", "problems_sha256": "a" * 16, "problems": "24", "samples": "1",
           "temperature": "0.0", "protocol": "tapo", "mode": "tools"}
# Each differs from SETTING in one way a comparison must not ignore.
INCOMPARABLE = {"fewer problems": {"problems_sha256": "b" * 16, "problems": "8"}, "other split": {"split": "gsm8k"},
                "sampled": {"samples": "4", "temperature": "1.0"}, "other protocol": {"protocol": "torl"},
                "no tools": {"mode": "no_tools"}}


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
    decision = update_champion(run_cfg, str(first), 0.40, setting=SETTING)
    assert decision.promoted and decision.version == "1" and decision.reason == "no champion yet"
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"

    # Worse, then equal: the alias stays, but the accuracy is recorded on the evaluated version.
    assert not update_champion(run_cfg, "models:/tapo-policy/2", 0.30, setting=SETTING).promoted
    assert client.get_model_version(MODEL_NAME, "2").tags[ACCURACY_TAG] == "0.3"
    tie = update_champion(run_cfg, str(third), 0.40, setting=SETTING)
    assert not tie.promoted and tie.previous_version == "1" and tie.previous_accuracy == pytest.approx(0.40)
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"

    # Better: the alias moves, and the champion resolves to that version's files.
    better = update_champion(run_cfg, "models:/tapo-policy/latest", 0.55, setting=SETTING)
    assert better.promoted and better.version == "3" and better.previous_version == "1"
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "3"
    local = champion_dir(run_cfg, cache_dir=tmp_path / "cache")
    assert (local / "config.json").is_file()
    assert model_digest(local) == model_digest(third) != model_digest(first)


def test_unregistered_model_changes_nothing(run_cfg: RunSection, tmp_path: Path) -> None:
    log_and_register(run_cfg, _train_run(run_cfg), _model(tmp_path / "registered", seed=0))
    stranger = _model(tmp_path / "stranger", seed=5)
    decision = update_champion(run_cfg, str(stranger), 0.99, setting=SETTING)
    assert not decision.promoted and decision.version is None
    assert find_version(run_cfg, "models:/other-model/1") is None
    with pytest.raises(RegistryError, match="no 'champion' alias"):
        champion_dir(run_cfg, cache_dir=tmp_path / "cache")


def test_clear_errors_for_bad_input(run_cfg: RunSection, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="no config.json"):
        log_and_register(run_cfg, _train_run(run_cfg), tmp_path)
    with pytest.raises(RegistryError, match="not found"):
        log_and_register(run_cfg, "0" * 32, _model(tmp_path / "m", seed=0))


@pytest.mark.parametrize("change", list(INCOMPARABLE), ids=list(INCOMPARABLE))
def test_an_incomparable_evaluation_leaves_the_champion_alone(run_cfg: RunSection, tmp_path: Path, change: str) -> None:
    """62.5% on 8 problems must not "beat" 45.8% on 24: the alias stays until the holder is evaluated alike."""
    first, second = (_model(tmp_path / f"policy{i}", seed=i) for i in range(2))
    for model in (first, second):
        log_and_register(run_cfg, _train_run(run_cfg), model)
    other = SETTING | INCOMPARABLE[change]
    assert setting_key(other) != setting_key(SETTING)
    client = MlflowClient(run_cfg.tracking_uri)
    assert update_champion(run_cfg, "models:/tapo-policy/1", 0.458, setting=SETTING).promoted
    higher = update_champion(run_cfg, "models:/tapo-policy/2", 0.625, setting=other)
    assert not higher.promoted and not higher.comparable and higher.previous_accuracy is None
    assert "not comparable" in higher.reason and "models:/tapo-policy@champion" in higher.reason
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"
    assert client.get_model_version(MODEL_NAME, "2").tags[f"eval.{setting_key(other)}.accuracy"] == "0.625"
    # The holder evaluated under that setting: now the two compare, and the better one takes the alias.
    assert not update_champion(run_cfg, "models:/tapo-policy/1", 0.5, setting=other).promoted
    moved = update_champion(run_cfg, "models:/tapo-policy/2", 0.625, setting=other)
    assert moved.promoted and moved.comparable and moved.previous_accuracy == pytest.approx(0.5)
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "2"


def test_a_version_is_a_logged_model_that_says_what_was_trained(run_cfg: RunSection, tmp_path: Path) -> None:
    run_id = _train_run(run_cfg)
    client = MlflowClient(run_cfg.tracking_uri)
    client.set_tag(run_id, "dvc.dep.data/curated/train.jsonl", "0123abcd")
    client.set_tag(run_id, "dvc.dep.models/sft", "feed")
    client.set_tag(run_id, "git_commit", "c0ffee")
    model = _model(tmp_path / "policy", seed=0)
    version = log_and_register(run_cfg, run_id, model, description="DAPO for 4 steps", tags={"train.steps": "4"})
    assert version.description == "DAPO for 4 steps"
    got = client.get_model_version(MODEL_NAME, version.version)
    assert got.tags[DIGEST_TAG] == model_digest(model) and got.tags["train.steps"] == "4"
    assert got.tags[TRAIN_RUN_TAG] == "train" and got.source.startswith("models:/m-")
    assert got.tags["train_run_id"] == run_id and got.tags["git_commit"] == "c0ffee"  # the run and the code
    # the DVC lineage is one file beside the model, not a tag per input (a version carried ~100 of them)
    assert not [t for t in got.tags if t.startswith("dvc.dep.")] and got.tags["dvc_lineage"].endswith("2 DVC inputs")
    logged = client.get_logged_model(got.source.removeprefix("models:/"))
    assert logged.source_run_id == run_id and str(logged.status).endswith("READY")
    lineage = json.loads(Path(mlflow.artifacts.download_artifacts(
        artifact_uri=f"{logged.artifact_location}/{LINEAGE_FILE}", dst_path=str(tmp_path / "l"))).read_text())
    assert lineage == {"data/curated/train.jsonl": "0123abcd", "models/sft": "feed"}  # the data, as DVC hashed it
    mlmodel = yaml.safe_load(Path(mlflow.artifacts.download_artifacts(
        artifact_uri=f"{logged.artifact_location}/MLmodel", dst_path=str(tmp_path / "d"))).read_text())
    assert "prompt" in mlmodel["signature"]["inputs"] and "response" in mlmodel["signature"]["outputs"]
    assert model_digest(champion_dir_of(run_cfg, version.version, tmp_path)) == model_digest(model)


def champion_dir_of(run_cfg: RunSection, version: str, tmp_path: Path) -> Path:
    update_champion(run_cfg, f"models:/{MODEL_NAME}/{version}", 0.5, setting=SETTING)
    return champion_dir(run_cfg, cache_dir=tmp_path / "cache")
