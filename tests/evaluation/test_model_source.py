"""Model references: local directories, hub ids, and MLflow URIs (runs:/ and models:/ aliases)."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from pipeline.tracking.model_source import ModelSourceError, fingerprint, is_mlflow_uri, resolve_model


def test_hub_ids_pass_through_and_local_paths_are_checked(tmp_path) -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", "sqlite:///x.db") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_model("smollm2-135m-instruct", "sqlite:///x.db") == "smollm2-135m-instruct"
    with pytest.raises(ModelSourceError, match="no such directory"):
        resolve_model(str(tmp_path / "gone"), "sqlite:///x.db")


def test_fingerprint_changes_when_the_model_is_rewritten(tiny_model_dir, tmp_path) -> None:
    copy = tmp_path / "m"
    copy.mkdir()
    (copy / "config.json").write_text("{}")
    before = fingerprint(str(copy))
    (copy / "model.safetensors").write_bytes(b"123")
    assert fingerprint(str(copy)) != before
    assert fingerprint("org/name") == "org/name"


def test_mlflow_run_and_registered_model_uris_resolve(tiny_model_dir, tmp_path) -> None:
    tracking = f"sqlite:///{tmp_path / 'mlruns.db'}"
    mlflow.set_tracking_uri(tracking)
    experiment = mlflow.create_experiment("eval-test", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as active:
        mlflow.log_artifacts(str(tiny_model_dir), artifact_path="policy")
    run_uri = f"runs:/{active.info.run_id}/policy"
    local = resolve_model(run_uri, tracking, cache_dir=tmp_path / "cache")
    assert (tmp_path / "cache") in Path(local).parents
    assert sorted(p.name for p in Path(local).iterdir()) == \
        sorted(p.name for p in tiny_model_dir.iterdir())
    client = mlflow.MlflowClient()
    client.create_registered_model("tapo-policy")
    version = client.create_model_version("tapo-policy", source=f"{active.info.artifact_uri}/policy",
                                          run_id=active.info.run_id)
    client.set_registered_model_alias("tapo-policy", "champion", version.version)
    assert is_mlflow_uri("models:/tapo-policy@champion")
    via_alias = resolve_model("models:/tapo-policy@champion", tracking, cache_dir=tmp_path / "cache2")
    assert (Path(via_alias) / "config.json").is_file()
    with pytest.raises(ModelSourceError, match="models:/no-such-model@champion"):
        resolve_model("models:/no-such-model@champion", tracking, cache_dir=tmp_path / "cache3")
