"""The evaluations an ad-hoc evaluation is shown beside: the base model's, the SFT model's and the current policy's,
each the latest of its kind in the tracking store *under the same evaluation setting* (the same problems, samples,
temperature, protocol and mode: `pipeline.evaluation.setting`, the `eval.setting.*` tags every evaluation run has).

Which runs those are, MLflow knows: a baseline's is the latest finished run of its DVC stage (`evaluate-<name>`),
the policy's the run that evaluated the newest registered version of the policy under this setting (the registry
tags each version with it, `pipeline.tracking.registry`), else the latest finished `evaluate` stage run. Ad-hoc
runs (tagged `LABEL_TAG`) are never taken for the pipeline's. Each evaluation's files (`eval_run.json`, `eval.json`,
`eval_samples.jsonl`, logged under `evaluation/`) are downloaded into a folder of their own, which the evaluation
then reads as it reads `evaluate.compare_dirs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from pipeline.config.run import RunSection
from pipeline.tracking.registry import MODEL_NAME, SETTING_RUN_TAG, setting_key
from pipeline.tracking.runs import LABEL_TAG
SETTING_TAG = "eval.setting."
EVALUATION_FILES = ("eval_run.json", "eval.json", "eval_samples.jsonl")
ARTIFACT_DIR = "evaluation"
POLICY_STAGE = "evaluate"


def same_setting(run: Run, setting: Mapping[str, str]) -> bool:
    """Whether `run` evaluated under exactly `setting` (every key, nothing else)."""
    tags = {k.removeprefix(SETTING_TAG): v for k, v in run.data.tags.items() if k.startswith(SETTING_TAG)}
    return tags == dict(setting)


def latest_of_stage(client: MlflowClient, experiment_id: str, stage: str, setting: Mapping[str, str]) -> Run | None:
    """The newest finished run of DVC stage `stage` (not an ad-hoc one) under `setting`."""
    runs = client.search_runs([experiment_id], f"tags.stage = '{stage}' and attributes.status = 'FINISHED'",
                              order_by=["attributes.start_time DESC"], max_results=200)
    return next((r for r in runs if LABEL_TAG not in r.data.tags and same_setting(r, setting)), None)


def registered_policy_run(client: MlflowClient, setting: Mapping[str, str]) -> Run | None:
    """The evaluation, under `setting`, of the newest registered version of the policy evaluated under it."""
    try:
        versions = client.search_model_versions(f"name = '{MODEL_NAME}'")
    except MlflowException:
        return None
    tag = SETTING_RUN_TAG.format(key=setting_key(setting))
    for version in sorted(versions, key=lambda v: int(v.version), reverse=True):
        if tag in version.tags:
            try:
                return client.get_run(version.tags[tag])
            except MlflowException:
                continue  # a run deleted since
    return None


def comparable_runs(run_cfg: RunSection, setting: Mapping[str, str], baselines: Sequence[str]) -> dict[str, Run]:
    """name -> run: each baseline's stage (`evaluate-<name>`) and the policy (`policy`) evaluated under `setting`,
    those found, in that order."""
    client = MlflowClient(run_cfg.tracking_uri)
    experiment = client.get_experiment_by_name(run_cfg.experiment)
    if experiment is None:
        return {}
    found = {name: latest_of_stage(client, experiment.experiment_id, f"evaluate-{name}", setting) for name in baselines}
    found["policy"] = registered_policy_run(client, setting) or latest_of_stage(
        client, experiment.experiment_id, POLICY_STAGE, setting)
    return {name: run for name, run in found.items() if run is not None}


def download_evaluation(run_cfg: RunSection, run: Run, dest: Path) -> Path | None:
    """The evaluation files of `run` in `dest` (replaced), or None when its run logged them not all."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        for name in EVALUATION_FILES:
            mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=f"{ARTIFACT_DIR}/{name}",
                                                dst_path=str(dest), tracking_uri=run_cfg.tracking_uri)
    except (MlflowException, OSError):
        return None
    # a single file's download lands in `dest` itself, not under its artifact folder
    return dest if all((dest / name).is_file() for name in EVALUATION_FILES) else None


def comparable_evaluations(run_cfg: RunSection, setting: Mapping[str, str], baselines: Sequence[str],
                           dest: Path) -> list[Path]:
    """The folders of the comparable evaluations (`comparable_runs`), downloaded under `dest/<name>/`, in order."""
    found = [download_evaluation(run_cfg, run, dest / name)
             for name, run in comparable_runs(run_cfg, setting, baselines).items()]
    return [folder for folder in found if folder is not None]
