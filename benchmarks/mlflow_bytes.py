"""Bytes one pipeline run logs to MLflow: the artifacts of its parent run and stage runs, and the logged models
those runs produced (the registered policy).

    .venv/bin/python -m flows.pipeline --params params.yaml      # or dvc repro: one default run
    .venv/bin/python -m benchmarks.mlflow_bytes [--params params.yaml] [--parent RUN_ID] [--quick]

Reads a local artifact store (the default `sqlite:///mlruns.db` keeps artifacts under ./mlruns). Without
`--parent`, the newest parent run of the experiment. The last line is one JSON object: "bytes" in total,
per stage run and for the logged models, and "model_bytes" (the final model's files), so a reader sees
what beyond the model itself is logged. `--quick` measures a run it logs itself into a scratch store, as the flows
log one (a parent run, one stage run under it with a small artifact folder).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from mlflow import MlflowClient

from benchmarks import harness
from flows.tracking import parent_run
from pipeline.config import RunConfig
from pipeline.config.run import RunSection
from pipeline.tracking.runs import log_dir, log_metrics, tracked_run


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


def log_quick_run(work: Path) -> RunConfig:
    """A scratch store under `work` (artifacts there too, not in ./mlruns) holding one pipeline run as the flows
    log it: a parent run and one stage run under it, with a metric and a small artifact folder."""
    cfg = harness.derive({"run.tracking_uri": f"sqlite:///{work / 'mlruns.db'}"})
    MlflowClient(cfg.run.tracking_uri).create_experiment(cfg.run.experiment, artifact_location=(work / "art").as_uri())
    (work / "outputs").mkdir()
    (work / "outputs" / "metrics.json").write_text('{"accuracy": 0.5}\n')
    with parent_run(cfg.run, "quick", {"run": cfg.run.model_dump()}, {}), \
            tracked_run(cfg.run, "train", {"train": {"steps": 1}}):
        log_metrics({"reward/mean": 0.5}, step=0)
        log_dir(work / "outputs", "metrics")
    return cfg


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=harness.PARAMS)
    parser.add_argument("--parent", default=None, help="the parent run (default: the newest)")
    args = harness.parse(parser, argv, {})
    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = (log_quick_run(Path(tmp)) if args.quick else harness.derive(params=args.params)).run
        result = measure_newest(run_cfg, args.parent)
    for name, size in sorted(result["runs"].items()):
        print(f"{name:40s} {size / 1e6:10.1f} MB")
    print(f"{'logged models':40s} {result['model_bytes'] / 1e6:10.1f} MB")
    harness.last_line(result, args.quick)


def measure_newest(run_cfg: RunSection, parent_id: str | None) -> dict:
    """`measure` of the run `parent_id`, or of the experiment's newest pipeline run."""
    client = MlflowClient(run_cfg.tracking_uri)
    experiment = client.get_experiment_by_name(run_cfg.experiment)
    if experiment is None:
        raise SystemExit(f"no experiment {run_cfg.experiment!r} at {run_cfg.tracking_uri}: run the pipeline first")
    parent = parent_id or next(iter(client.search_runs(
        [experiment.experiment_id], "tags.stage = 'pipeline'", order_by=["start_time DESC"], max_results=1)), None)
    if parent is None:
        raise SystemExit("no pipeline run in the experiment: run the pipeline first")
    return measure(client, experiment.experiment_id, parent if isinstance(parent, str) else parent.info.run_id)


if __name__ == "__main__":
    main()
