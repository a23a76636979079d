"""Resolve the model to evaluate: a local directory, an embedded model, a hub id or an MLflow URI.

MLflow model URIs (`models:/tapo-policy@champion`, `models:/tapo-policy/3`, `runs:/<run id>/policy`,
`mlflow-artifacts:/...`) are downloaded with `mlflow.artifacts.download_artifacts` into a cache
directory keyed by the URI; no MLflow flavour is needed: the artifact must contain a Hugging Face
model directory (a `config.json`), either at its root or in exactly one subdirectory (as
`mlflow.transformers` writes it). The tracking URI is the run section's.

`fingerprint` names what was evaluated for the resume key: a retrained model in the same
directory has new file sizes and times, so its samples are never mixed with the old ones.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import mlflow

from pipeline.model import EMBEDDED_MODELS

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")


class ModelSourceError(ValueError):
    """A model that cannot be found or read."""


def is_mlflow_uri(model: str) -> bool:
    return model.startswith(MLFLOW_SCHEMES)


def hf_model_dir(root: Path, uri: str) -> Path:
    """The directory holding config.json: `root` itself or its single such subdirectory."""
    if (root / "config.json").is_file():
        return root
    found = sorted(p.parent for p in root.rglob("config.json"))
    if len(found) != 1:
        raise ModelSourceError(f"model {uri!r}: expected one Hugging Face model directory (config.json) "
                               f"in the artifact, found {len(found)}")
    return found[0]


def download_mlflow_model(uri: str, tracking_uri: str, cache_dir: Path) -> Path:
    mlflow.set_tracking_uri(tracking_uri)
    dest = cache_dir / hashlib.sha1(uri.encode()).hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True)
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest))
    except Exception as err:  # MLflow raises several unrelated types (MlflowException, OSError, ...)
        raise ModelSourceError(f"model {uri!r}: cannot download from MLflow ({tracking_uri}): {err}") from None
    return hf_model_dir(Path(local), uri)


def resolve_model(model: str, tracking_uri: str, cache_dir: Path = Path(".cache/evaluate/models")) -> str:
    """A path or name `pipeline.model.load_policy` can read; raises ModelSourceError when missing."""
    if is_mlflow_uri(model):
        return str(download_mlflow_model(model, tracking_uri, cache_dir))
    if model in EMBEDDED_MODELS:
        return model
    local = Path(model)
    # "owner/name" is a hub id unless its first part is a local directory (e.g. models/policy).
    looks_local = local.exists() or local.parent.exists() or model.count("/") != 1 or model.startswith((".", "/"))
    if looks_local and not (local / "config.json").is_file():
        reason = "no such directory" if not local.exists() else "not a Hugging Face model directory (no config.json)"
        raise ModelSourceError(f"model {model!r}: {reason}")
    return model


def fingerprint(resolved: str) -> str:
    """Names plus sizes and mtimes of a model directory's files (or the name of a hub/embedded model)."""
    local = Path(resolved)
    if not local.is_dir():
        return resolved
    parts = [f"{p.relative_to(local)}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
             for p in sorted(local.rglob("*")) if p.is_file()]
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()
