"""An ad-hoc evaluation is shown beside the pipeline's (`pipeline.tracking.comparable`): the base and SFT stages'
latest evaluations and the current policy's, each under the same evaluation setting, read back from the tracking
store as the evaluation's own files; another setting, an ad-hoc run and an unfinished one are never taken."""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from pipeline.config.run import RunSection
from pipeline.evaluation.results import RUN_FILE, load_run
from pipeline.tracking.comparable import comparable_evaluations, comparable_runs
from pipeline.tracking.registry import MODEL_NAME, SETTING_RUN_TAG, setting_key
from pipeline.tracking.runs import LABEL_TAG

SETTING = {"split": "calculator,wiki_facts", "problems": "8", "samples": "1", "temperature": "0.0"}
OTHER = SETTING | {"samples": "4"}


@pytest.fixture()
def run_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunSection:
    monkeypatch.chdir(tmp_path)  # the SQLite store's artifacts go beside it
    cfg = RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="comparable-test")
    mlflow.set_tracking_uri(cfg.tracking_uri)
    mlflow.set_experiment(cfg.experiment)
    return cfg


def evaluation(tmp: Path, stage: str, label: str, setting: dict[str, str], *, ad_hoc: bool = False,
               finished: bool = True) -> str:
    """An evaluation run as the evaluate stage logs one: its setting tags and its files under `evaluation/`."""
    folder = tmp / f"files-{label}"
    folder.mkdir()
    (folder / RUN_FILE).write_text(json.dumps({"label": label, "model": f"models/{label}", "mode": "tools",
                                               "benchmarks": {"calculator": "math"}}))
    (folder / "eval.json").write_text(json.dumps({"all/accuracy": 0.5, "calculator/accuracy": 0.5}))
    (folder / "eval_samples.jsonl").write_text(json.dumps({"id": "c1", "benchmark": "calculator", "score": 1.0}) + "\n")
    tags = {"stage": stage} | ({LABEL_TAG: label} if ad_hoc else {})
    run = mlflow.start_run(run_name=label, tags=tags)
    mlflow.set_tags({f"eval.setting.{k}": v for k, v in setting.items()})
    for path in sorted(folder.iterdir()):
        mlflow.log_artifact(str(path), artifact_path="evaluation")
    mlflow.end_run("FINISHED" if finished else "KILLED")
    return run.info.run_id


def test_an_ad_hoc_evaluation_is_shown_beside_the_pipelines_under_its_setting(run_cfg: RunSection,
                                                                              tmp_path: Path) -> None:
    evaluation(tmp_path, "evaluate-base", "base-old", SETTING)
    evaluation(tmp_path, "evaluate-base", "base", SETTING)  # the latest of its stage
    evaluation(tmp_path, "evaluate-base", "base-other", OTHER)  # later, under another setting
    evaluation(tmp_path, "evaluate-sft", "sft", SETTING)
    evaluation(tmp_path, "evaluate-sft", "sft-killed", SETTING, finished=False)
    evaluation(tmp_path, "evaluate", "policy", SETTING)
    evaluation(tmp_path, "evaluate", "step12", SETTING, ad_hoc=True)  # an ad-hoc one is never the pipeline's
    folders = comparable_evaluations(run_cfg, SETTING, ["base", "sft"], tmp_path / "compared")
    assert [load_run(f).label for f in folders] == ["base", "sft", "policy"]
    assert [f.name for f in folders] == ["base", "sft", "policy"]  # each in a folder of its own
    assert comparable_evaluations(run_cfg, SETTING | {"problems": "9"}, ["base", "sft"], tmp_path / "none") == []


def test_the_policy_is_the_registered_versions_evaluation(run_cfg: RunSection, tmp_path: Path) -> None:
    """The registry says which evaluation is the current policy's, over the latest `evaluate` stage run."""
    champion = evaluation(tmp_path, "evaluate", "registered", SETTING)
    evaluation(tmp_path, "evaluate", "later-unregistered", SETTING)
    client = MlflowClient(run_cfg.tracking_uri)
    client.create_registered_model(MODEL_NAME)
    version = client.create_model_version(MODEL_NAME, source="models/policy", run_id=champion)
    client.set_model_version_tag(MODEL_NAME, version.version, SETTING_RUN_TAG.format(key=setting_key(SETTING)),
                                 champion)
    assert comparable_runs(run_cfg, SETTING, [])["policy"].info.run_id == champion
    (policy,) = comparable_evaluations(run_cfg, SETTING, ["base"], tmp_path / "compared")  # no base evaluated
    assert load_run(policy).label == "registered"
