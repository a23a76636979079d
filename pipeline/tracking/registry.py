"""The MLflow model registry: register the trained policy, keep a `champion` alias, resolve it.

* `log_and_register` logs the final model directory as an MLflow *logged model* of the train run (its
  files plus an `MLmodel` file with the text-in, text-out signature; no flavour, see below) and registers
  it as a new version of `tapo-policy`, tagged with what a person looks for: a digest of the directory's content
  (so an evaluation of `models/policy` can later find its version), the run that trained it (name and id), the
  code (`git_commit`), what the caller records (the training's algorithm, steps, data and its hash) and a
  description of what was trained. The DVC hash of every input of the run (`dvc.dep.<path>` on the run, a few
  dozen) is one file beside the model's, `dvc_lineage.json`, not a tag each.
* `update_champion` records an evaluation's accuracy on the version it evaluated, keyed by the
  evaluation's setting (split, problem-set hash, samples, temperature, protocol, mode: `setting_key`),
  and moves the `champion` alias to it only when it beats the holder's accuracy *under the same
  setting* (strictly; a tie keeps the holder). A holder never evaluated under that setting is not
  compared: the alias stays and the reason says how to evaluate the holder so.
* `champion_dir` resolves `models:/tapo-policy@champion` to a local Hugging Face directory.

Departure from MLflow's usual path: no MLflow flavour is logged. The policy is a plain Hugging Face
directory that transformers and vLLM read as it is (and `mlflow.transformers` cannot log a local
checkpoint with the pinned transformers), so the logged model carries the files and the signature only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import LoggedModel, Run
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.models import Model, ModelSignature
from mlflow.types.schema import ColSpec, Schema

from pipeline.config.run import RunSection
from pipeline.tracking.model_source import download_mlflow_model
from pipeline.tracking.runs import DVC_TAG_PREFIX

MODEL_NAME = "tapo-policy"
CHAMPION = "champion"
ARTIFACT_PATH = "policy"  # the logged model's name
DIGEST_TAG = "content_sha256"
TRAIN_RUN_ID_TAG = "train_run_id"
CODE_TAG = "git_commit"
LINEAGE_FILE = "dvc_lineage.json"  # beside the logged model's files: {path: DVC md5} of every input of its run
LINEAGE_TAG = "dvc_lineage"
ACCURACY_TAG = "eval_accuracy"  # the latest evaluation's, whatever its setting
EVAL_RUN_TAG = "eval_run_id"
TRAIN_RUN_TAG = "train_run"  # the training run's name (the DVC experiment's or the flow run's)
SETTING_TAG = "eval.{key}.setting"  # per evaluation setting: what it was, the accuracy and the run
SETTING_ACCURACY_TAG = "eval.{key}.accuracy"
SETTING_RUN_TAG = "eval.{key}.run_id"
MLMODEL = "MLmodel"
MLFLOW_FILES = (MLMODEL, "registered_model_meta", LINEAGE_FILE)  # beside the model's files, not of its content
SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string", "prompt")]), outputs=Schema([ColSpec("string", "response")]))
_VERSION_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+|latest)|@(?P<alias>[\w-]+))$")


class RegistryError(RuntimeError):
    """A registry operation that cannot be done (missing run, model, alias or directory)."""


@dataclass(frozen=True)
class ChampionDecision:
    """What `update_champion` did, and why (printed by the evaluate flow)."""

    version: str | None
    accuracy: float
    previous_version: str | None
    previous_accuracy: float | None  # the holder's accuracy under the same setting (None: none recorded)
    promoted: bool
    reason: str
    comparable: bool = True  # False: the holder has no evaluation under this setting


def setting_key(setting: Mapping[str, str]) -> str:
    """The first 12 hex digits of the setting's sha256: evaluations with the same key are compared."""
    return hashlib.sha256(json.dumps(dict(setting), sort_keys=True).encode()).hexdigest()[:12]


def describe_setting(setting: Mapping[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(setting.items()))


def quiet_progress_unless_tty() -> None:
    """MLflow draws artifact progress bars on stderr; keep logs clean when not on a terminal."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def model_digest(model_dir: Path) -> str:
    """sha256 over the relative names and bytes of every file (stable across copies and downloads; the files
    MLflow keeps beside a logged model's, `MLFLOW_FILES`, are not the model's content)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise RegistryError(f"model directory {root} does not exist")
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and str(p.relative_to(root)) not in MLFLOW_FILES):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _client(run_cfg: RunSection) -> MlflowClient:
    quiet_progress_unless_tty()
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    return MlflowClient(run_cfg.tracking_uri)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="TAPO policy: a Hugging Face model directory.")


def log_and_register(run_cfg: RunSection, run_id: str, model_dir: Path, name: str = MODEL_NAME, *,
                     description: str = "", tags: Mapping[str, str] | None = None) -> ModelVersion:
    """Log `model_dir` as a logged model of run `run_id` and register it as a new version of `name`, tagged
    with its digest, the run (name, id, commit) and `tags`, its run's DVC inputs one file beside it
    (`LINEAGE_FILE`); described by `description`."""
    client = _client(run_cfg)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise RegistryError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise RegistryError(f"MLflow run {run_id!r} not found at {run_cfg.tracking_uri}: {err}") from None
    lineage = {k.removeprefix(DVC_TAG_PREFIX): v for k, v in sorted(run.data.tags.items())
               if k.startswith(DVC_TAG_PREFIX)}
    version_tags = {DIGEST_TAG: model_digest(model_dir), TRAIN_RUN_TAG: run.info.run_name or run_id,
                    TRAIN_RUN_ID_TAG: run_id, CODE_TAG: run.data.tags.get(CODE_TAG, "unknown"),
                    LINEAGE_TAG: f"{LINEAGE_FILE}: {len(lineage)} DVC inputs", **(tags or {})}
    logged = log_model_dir(client, run, model_dir, version_tags, lineage)
    _ensure_registered_model(client, name)
    return client.create_model_version(name, f"models:/{logged.model_id}", run_id=run_id, tags=version_tags,
                                       description=description or f"trained by run {version_tags[TRAIN_RUN_TAG]}",
                                       model_id=logged.model_id)


def log_model_dir(client: MlflowClient, run: Run, model_dir: Path, tags: Mapping[str, str],
                  lineage: Mapping[str, str] | None = None) -> LoggedModel:
    """A READY logged model of `run`: the directory's files, an `MLmodel` with the signature and the run's DVC
    inputs (`LINEAGE_FILE`)."""
    logged = client.create_logged_model(run.info.experiment_id, name=ARTIFACT_PATH, source_run_id=run.info.run_id,
                                        tags=dict(tags), model_type="hf-causal-lm")
    try:
        client.log_model_artifacts(logged.model_id, str(model_dir))
        with tempfile.TemporaryDirectory() as meta:
            Model(artifact_path=logged.artifact_location, run_id=run.info.run_id, model_id=logged.model_id,
                  signature=SIGNATURE).save(str(Path(meta) / MLMODEL))
            (Path(meta) / LINEAGE_FILE).write_text(json.dumps(dict(lineage or {}), indent=1, sort_keys=True))
            client.log_model_artifacts(logged.model_id, meta)
    except BaseException:
        client.finalize_logged_model(logged.model_id, "FAILED")
        raise
    return client.finalize_logged_model(logged.model_id, "READY")


def find_version(run_cfg: RunSection, model: str, name: str = MODEL_NAME) -> ModelVersion | None:
    """The registered version a model reference denotes: `models:/name/N`, `models:/name@alias`,
    `models:/name/latest`, or a local directory matched by content digest; None if unregistered."""
    client = _client(run_cfg)
    match = _VERSION_URI.match(model)
    if match:
        if match["name"] != name:
            return None
        try:
            if match["alias"]:
                return client.get_model_version_by_alias(name, match["alias"])
            if match["version"] == "latest":
                return latest_version(run_cfg, name)
            return client.get_model_version(name, match["version"])
        except MlflowException:
            return None
    if not Path(model).is_dir():
        return None
    digest = model_digest(Path(model))
    try:
        found = client.search_model_versions(f"name = '{name}' and tags.{DIGEST_TAG} = '{digest}'")
    except MlflowException:
        return None
    # Several trainings may yield identical weights; the newest version is the one just evaluated.
    return max(found, key=lambda v: int(v.version), default=None)


def latest_version(run_cfg: RunSection, name: str = MODEL_NAME) -> ModelVersion | None:
    client = _client(run_cfg)
    try:
        versions = client.search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    return max(versions, key=lambda v: int(v.version), default=None)


def _accuracy_under(version: ModelVersion | None, key: str) -> float | None:
    value = version.tags.get(SETTING_ACCURACY_TAG.format(key=key)) if version is not None else None
    return None if value is None else float(value)


def _settings_of(version: ModelVersion) -> list[str]:
    return [v for k, v in sorted(version.tags.items()) if re.fullmatch(SETTING_TAG.format(key="[0-9a-f]+"), k)]


def record_evaluation(client: MlflowClient, version: ModelVersion, accuracy: float, setting: Mapping[str, str],
                      eval_run_id: str | None) -> None:
    key = setting_key(setting)
    tags = {ACCURACY_TAG: repr(float(accuracy)), SETTING_ACCURACY_TAG.format(key=key): repr(float(accuracy)),
            SETTING_TAG.format(key=key): describe_setting(setting)}
    if eval_run_id:
        tags |= {EVAL_RUN_TAG: eval_run_id, SETTING_RUN_TAG.format(key=key): eval_run_id}
    for tag, value in tags.items():
        client.set_model_version_tag(version.name, version.version, tag, value)


def update_champion(run_cfg: RunSection, model: str, accuracy: float, *, setting: Mapping[str, str],
                    eval_run_id: str | None = None, name: str = MODEL_NAME) -> ChampionDecision:
    """Record `accuracy` under `setting` on the version `model` denotes; move `champion` to it only if it
    beats the holder's accuracy under the same setting."""
    client = _client(run_cfg)
    version = find_version(run_cfg, model, name)
    if version is None:
        return ChampionDecision(None, accuracy, None, None, False, f"{model} is not a registered version of {name}")
    record_evaluation(client, version, accuracy, setting, eval_run_id)
    try:
        holder = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        holder = None
    key, this = setting_key(setting), str(version.version)
    prev = str(holder.version) if holder else None
    held = _accuracy_under(holder, key)
    if prev == this:
        return ChampionDecision(this, accuracy, prev, held, False, "already the champion")
    if holder is not None and held is None:
        return ChampionDecision(this, accuracy, prev, None, False, (
            f"not comparable: champion v{prev} has no evaluation under this setting ({describe_setting(setting)}); "
            f"its evaluations: {'; '.join(_settings_of(holder)) or 'none'}. Evaluate it under this setting "
            f"(python -m flows.evaluate --model models:/{name}@{CHAMPION} with the same params) to compare"),
            comparable=False)
    if held is not None and accuracy <= held:
        return ChampionDecision(this, accuracy, prev, held, False,
                                f"accuracy {accuracy:.4f} does not beat champion v{prev} ({held:.4f}, same setting)")
    client.set_registered_model_alias(name, CHAMPION, this)
    why = "no champion yet" if holder is None else f"beats v{prev} ({held:.4f}, same setting)"
    return ChampionDecision(this, accuracy, prev, held, True, why)


def champion_dir(run_cfg: RunSection, cache_dir: Path = Path(".cache/registry"), name: str = MODEL_NAME) -> Path:
    """Download (once per URI into `cache_dir`) the champion's model directory and return it."""
    client = _client(run_cfg)
    try:
        holder = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        raise RegistryError(f"no {CHAMPION!r} alias on registered model {name!r} at {run_cfg.tracking_uri}") from None
    # Download by version, not alias: the cache is keyed by URI and the alias moves.
    return download_mlflow_model(f"models:/{name}/{holder.version}", run_cfg.tracking_uri, cache_dir)
