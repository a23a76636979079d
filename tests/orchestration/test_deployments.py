"""Deployments against a local Prefect server: deploy to a process work pool, trigger, a worker runs it.

The deployed flow is the real `evaluate-latest` (the nightly flow's second half) on a workspace
with a tiny registered model: the run must complete, write its evaluation outside metrics/ and
crown the model `champion` in the workspace's MLflow registry.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.deploy import NIGHTLY_CRON
from pipeline.config.run import RunSection
from pipeline.tracking.registry import CHAMPION, MODEL_NAME, log_and_register
from tests.helpers.workspace import TINY_EVAL, make_workspace, subprocess_env

pytestmark = pytest.mark.slow


def _register_tiny_model(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.chdir(ws)  # the artifact store sits beside the workspace's mlruns.db
    run_cfg = RunSection(experiment="orchestration-test", tracking_uri=f"sqlite:///{ws / 'mlruns.db'}")
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    with mlflow.start_run(run_name="train") as run:
        pass
    log_and_register(run_cfg, run.info.run_id, ws / "tiny-model")


def _run(cmd: list[str], ws: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


async def _deployment_schedules(api_url: str) -> dict[str, list[str]]:
    with temporary_settings({PREFECT_API_URL: api_url}):
        async with get_client() as client:
            found = await client.read_deployments()
            return {d.name: [s.schedule.cron for s in d.schedules] for d in found}


async def test_deploy_trigger_and_worker_completes_run(tmp_path: Path, repo_root: Path, prefect_server: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ws = make_workspace(tmp_path / "ws", repo_root, TINY_EVAL)
    _register_tiny_model(ws, monkeypatch)
    env = subprocess_env(prefect_server, tmp_path / "prefect-home")
    pool = f"pool-{tmp_path.name}"[:50]
    _run([sys.executable, "-m", "flows.deploy", "deploy", "--pool", pool, "--workdir", str(ws)], ws, env, 240)

    schedules = await _deployment_schedules(prefect_server)
    assert schedules["nightly"] == [NIGHTLY_CRON]
    assert {"evaluate-latest", "pipeline"} <= schedules.keys()

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        flow_run = await run_deployment("evaluate-latest/evaluate-latest", timeout=0)
    worker = _run([str(Path(sys.executable).with_name("prefect")), "worker", "start", "--pool", pool,
                   "--type", "process", "--run-once"], ws, env, 420)

    with temporary_settings({PREFECT_API_URL: prefect_server}):
        async with get_client() as client:
            state = (await client.read_flow_run(flow_run.id)).state
    assert state is not None and state.is_completed(), f"{state}\n{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
    evaluation = json.loads((ws / "runs/evaluate-latest/v1/eval.json").read_text())
    assert evaluation["n_problems"] == 2
    assert not (ws / "metrics/eval.json").exists()  # the DVC stage's output stays untouched
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    assert str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION).version) == "1"
