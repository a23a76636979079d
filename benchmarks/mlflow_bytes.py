"""Bytes one pipeline run logs to MLflow: the artifacts of its parent run and stage runs, and the logged models
those runs produced (the registered policy).

    .venv/bin/python -m flows.pipeline --params params.yaml      # or dvc repro: one default run
    .venv/bin/python -m benchmarks.mlflow_bytes [--params params.yaml] [--parent RUN_ID]

Reads a local artifact store (the default `sqlite:///mlruns.db` keeps artifacts under ./mlruns). Without
`--parent`, the newest parent run of the experiment. The last line is one JSON object: "bytes" in total,
per stage run and for the logged models, and "model_bytes" (the final model's files), so a reader sees
what beyond the model itself is logged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from mlflow import MlflowClient

from pipeline.config import DEFAULT_PARAMS, load_config


def local_bytes(uri: str) -> int:
    """Bytes under a local artifact URI (file:// or a plain path); 0 when it does not exist."""
    parsed = urlparse(uri)
    root = Path(unquote(parsed.path)) if parsed.scheme in ("file", "") else None
    if root is None:
        raise SystemExit(f"{uri}: not a local artifact store; measure it where it lives")
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def measure(client: MlflowClient, experiment_id: str, parent_id: str) -> dict:
    children = client.search_runs([experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'")
    runs = [client.get_run(parent_id), *children]
    per_run = {r.info.run_name or r.info.run_id: local_bytes(r.info.artifact_uri) for r in runs}
    models = [m for r in runs for m in client.search_logged_models(
        experiment_ids=[experiment_id], filter_string=f"source_run_id = '{r.info.run_id}'")]
    per_model = {m.model_id: local_bytes(m.artifact_location) for m in models}
    model_bytes = sum(per_model.values())
    return {"parent": parent_id, "bytes": sum(per_run.values()) + model_bytes, "runs": per_run,
            "logged_models": per_model, "model_bytes": model_bytes,
            "bytes_beyond_model": sum(per_run.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(DEFAULT_PARAMS))
    parser.add_argument("--parent", default=None, help="the parent run (default: the newest)")
    args = parser.parse_args()
    run_cfg = load_config(args.params).run
    client = MlflowClient(run_cfg.tracking_uri)
    experiment = client.get_experiment_by_name(run_cfg.experiment)
    if experiment is None:
        raise SystemExit(f"no experiment {run_cfg.experiment!r} at {run_cfg.tracking_uri}: run the pipeline first")
    parent = args.parent or next(iter(client.search_runs(
        [experiment.experiment_id], "tags.stage = 'pipeline'", order_by=["start_time DESC"], max_results=1)), None)
    if parent is None:
        raise SystemExit("no pipeline run in the experiment: run the pipeline first")
    result = measure(client, experiment.experiment_id, parent if isinstance(parent, str) else parent.info.run_id)
    for name, size in sorted(result["runs"].items()):
        print(f"{name:40s} {size / 1e6:10.1f} MB")
    print(f"{'logged models':40s} {result['model_bytes'] / 1e6:10.1f} MB")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
