"""The MLflow model registry: register the trained policy, keep a `champion` alias, resolve it.

* `log_and_register` logs the final model directory as the artifacts of the train run and
  registers them as a new version of `tapo-policy`, tagged with a digest of the directory's
  content (so an evaluation of `models/policy` can later find its version).
* `update_champion` records an evaluation's accuracy on the version it evaluated and moves the
  `champion` alias to it only when it beats the current holder's recorded accuracy (strictly;
  a tie keeps the holder, so a re-run of the same model never flips the alias back and forth).
* `champion_dir` resolves `models:/tapo-policy@champion` to a local Hugging Face directory.

Departure from MLflow's usual path: no MLflow flavour (`mlflow.transformers`, pyfunc) is
logged. The policy is a plain Hugging Face directory that transformers and vLLM read as it is,
so the version's source is the run's artifact folder, registered with `create_model_version`
(`mlflow.register_model` would insist on a "logged model" of a flavour).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from pipeline.config.run import RunSection
from pipeline.tracking.model_source import download_mlflow_model

MODEL_NAME = "tapo-policy"
CHAMPION = "champion"
ARTIFACT_PATH = "policy"
DIGEST_TAG = "content_sha256"
ACCURACY_TAG = "eval_accuracy"
EVAL_RUN_TAG = "eval_run_id"
_VERSION_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+|latest)|@(?P<alias>[\w-]+))$")


class RegistryError(RuntimeError):
    """A registry operation that cannot be done (missing run, model, alias or directory)."""


@dataclass(frozen=True)
class ChampionDecision:
    """What `update_champion` did, and why (printed by the evaluate flow)."""

    version: str | None
    accuracy: float
    previous_version: str | None
    previous_accuracy: float | None
    promoted: bool
    reason: str


def quiet_progress_unless_tty() -> None:
    """MLflow draws artifact progress bars on stderr; keep logs clean when not on a terminal."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def model_digest(model_dir: Path) -> str:
    """sha256 over the relative names and bytes of every file (stable across copies and downloads)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise RegistryError(f"model directory {root} does not exist")
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
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


def log_and_register(run_cfg: RunSection, run_id: str, model_dir: Path, name: str = MODEL_NAME) -> ModelVersion:
    """Log `model_dir` into run `run_id` under `policy/` and register it as a new version of `name`."""
    client = _client(run_cfg)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise RegistryError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise RegistryError(f"MLflow run {run_id!r} not found at {run_cfg.tracking_uri}: {err}") from None
    digest = model_digest(model_dir)
    client.log_artifacts(run_id, str(model_dir), ARTIFACT_PATH)
    _ensure_registered_model(client, name)
    return client.create_model_version(name, f"{run.info.artifact_uri}/{ARTIFACT_PATH}", run_id=run_id,
                                       tags={DIGEST_TAG: digest},
                                       description=f"trained directory {model_dir}")


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


def _recorded_accuracy(version: ModelVersion | None) -> float | None:
    if version is None or ACCURACY_TAG not in version.tags:
        return None
    return float(version.tags[ACCURACY_TAG])


def update_champion(run_cfg: RunSection, model: str, accuracy: float, *, eval_run_id: str | None = None,
                    name: str = MODEL_NAME) -> ChampionDecision:
    """Record `accuracy` on the version `model` denotes; move `champion` to it only if it beats the holder."""
    client = _client(run_cfg)
    version = find_version(run_cfg, model, name)
    if version is None:
        return ChampionDecision(None, accuracy, None, None, False, f"{model} is not a registered version of {name}")
    client.set_model_version_tag(name, version.version, ACCURACY_TAG, repr(float(accuracy)))
    if eval_run_id:
        client.set_model_version_tag(name, version.version, EVAL_RUN_TAG, eval_run_id)
    try:
        holder = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        holder = None
    held = _recorded_accuracy(holder)
    prev = str(holder.version) if holder else None
    this = str(version.version)
    if prev == this:
        return ChampionDecision(this, accuracy, prev, held, False, "already the champion")
    if held is not None and accuracy <= held:
        return ChampionDecision(this, accuracy, prev, held, False,
                                f"accuracy {accuracy:.4f} does not beat champion v{prev} ({held:.4f})")
    client.set_registered_model_alias(name, CHAMPION, this)
    why = "no champion yet" if holder is None else (
        f"champion v{prev} has no recorded accuracy" if held is None else f"beats v{prev} ({held:.4f})")
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
