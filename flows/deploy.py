"""Prefect deployments: a nightly `dvc repro` plus an evaluation of the latest registered model.

    python -m flows.deploy serve                 # serve them from this process (no work pool or worker)
    python -m flows.deploy deploy --pool tapo    # register them on a process work pool (created if absent),
    prefect worker start --pool tapo             # ...and run them with a worker in this directory

Both need a Prefect server (`prefect server start`, then PREFECT_API_URL=http://127.0.0.1:4200/api).
Deployments:
  nightly          cron NIGHTLY_CRON: `dvc repro` under an MLflow parent run, then evaluate-latest
  evaluate-latest  on demand: evaluate the newest version of tapo-policy (moves `champion` if it wins)
  pipeline         on demand: every stage as a subflow (or `use_dvc=true`)

Entrypoints are module paths run in `--workdir` (the checkout), so the worker needs no storage
block or image: the process worker starts `python -m prefect.engine` there.
The latest-model evaluation writes into runs/evaluate-latest/v<N>/, never into metrics/, which
belongs to the DVC evaluate stage (writing there would make `dvc repro` re-run it).
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

import yaml

NIGHTLY_CRON = "0 2 * * *"  # 02:00 UTC


def parser() -> argparse.ArgumentParser:
    """The command line, built before Prefect and MLflow are imported (seconds), so `--help` answers at once."""
    built = argparse.ArgumentParser(prog="python -m flows.deploy",
                                    description="Serve or deploy the tapo Prefect deployments.")
    built.add_argument("command", choices=("serve", "deploy"), help="serve here, or deploy to a work pool")
    built.add_argument("--params", default="params.yaml", help="params file, relative to --workdir")
    built.add_argument("--workdir", default=".", help="checkout the runs execute in (default: here)")
    built.add_argument("--pool", default="tapo", help="process work pool name (deploy only)")
    built.add_argument("--cron", default=NIGHTLY_CRON,
                       help=f"nightly schedule (default {NIGHTLY_CRON!r}, UTC)")
    return built


if __name__ == "__main__":
    parser().parse_args()

# After the command line (see `parser`).
from mlflow.entities.model_registry import ModelVersion  # noqa: E402
from prefect import flow, serve  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.actions import WorkPoolCreate  # noqa: E402
from prefect.deployments.runner import EntrypointType, RunnerDeployment, deploy  # noqa: E402
from prefect.exceptions import ObjectNotFound  # noqa: E402
from prefect.schedules import Cron  # noqa: E402

from flows.common import load_or_exit  # noqa: E402
from flows.summary import publish  # noqa: E402
from flows.evaluate import evaluate_flow  # noqa: E402
from flows.pipeline import pipeline_flow  # noqa: E402
from pipeline.config import RunConfig, read_params  # noqa: E402
from pipeline.evaluation.benchmarks import load_benchmarks  # noqa: E402
from pipeline.evaluation.setting import evaluation_setting  # noqa: E402
from pipeline.tracking.registry import (MODEL_NAME, SETTING_ACCURACY_TAG, RegistryError, latest_version,  # noqa: E402
                                        setting_key)

TIMEZONE = "UTC"
LATEST_OUTPUT_ROOT = "runs/evaluate-latest"


def params_for_output(params: str, output_dir: Path) -> Path:
    """A copy of `params` whose evaluate.output_dir is `output_dir` (written beside the outputs)."""
    data = read_params(Path(params).read_text())
    data["evaluate"]["output_dir"] = str(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    derived = output_dir / "params.yaml"
    derived.write_text(yaml.safe_dump(data, sort_keys=False))
    return derived


def evaluated_already(cfg: RunConfig, version: ModelVersion) -> str | None:
    """The accuracy `version` has under the evaluation setting `cfg` defines, if it was evaluated so."""
    key = setting_key(evaluation_setting(cfg.evaluate, cfg.rollout.protocol, load_benchmarks(cfg.evaluate)))
    return version.tags.get(SETTING_ACCURACY_TAG.format(key=key))


@flow(name="evaluate-latest", log_prints=True)
def evaluate_latest_flow(params: str = "params.yaml", output_root: str = LATEST_OUTPUT_ROOT) -> dict:
    """Evaluate the newest registered version of tapo-policy (unless it was, under the same setting); the
    evaluate flow updates `champion`."""
    cfg = load_or_exit(params)
    version = latest_version(cfg.run)
    if version is None:
        raise RegistryError(f"no registered version of {MODEL_NAME!r} at {cfg.run.tracking_uri}: "
                            "run the pipeline (its train stage registers the model) first")
    accuracy = evaluated_already(cfg, version)
    if accuracy is not None:
        print(f"{MODEL_NAME} v{version.version} was evaluated under this setting (accuracy {accuracy}): nothing to do")
        return {"version": version.version, "evaluated": False, "accuracy": float(accuracy)}
    derived = params_for_output(params, Path(output_root) / f"v{version.version}")
    print(f"evaluating {MODEL_NAME} v{version.version} (params {derived})")
    return evaluate_flow(str(derived), model=f"models:/{MODEL_NAME}/{version.version}",
                         label=f"{MODEL_NAME} v{version.version}")


@flow(name="nightly", log_prints=True)
def nightly_flow(params: str = "params.yaml") -> dict:
    """`dvc repro` (only what changed) under one MLflow parent run, then evaluate the latest model. A night with
    nothing to do (every stage up to date, the latest model evaluated alike) records that and opens no MLflow run."""
    repro = pipeline_flow(params, use_dvc=True)
    latest = evaluate_latest_flow(params)
    if repro.get("up_to_date") and latest.get("evaluated") is False:
        cfg = load_or_exit(params)
        publish("nightly", "nightly: nothing to do", f"Every stage is up to date and {MODEL_NAME} "
                f"v{latest['version']} was evaluated under this setting (accuracy {latest['accuracy']:.4f}).",
                cfg.run, None)
    return {"repro": repro, "evaluate_latest": latest}


def deployments(params: str, workdir: Path, cron: str = NIGHTLY_CRON, *, for_pool: bool) -> list[RunnerDeployment]:
    """The deployments; `for_pool` adds the process worker's job variables (serve rejects them)."""
    # Under `python -m flows.deploy` the flows above live in `__main__`, a module path a worker
    # cannot import; take them from the importable module instead.
    this = importlib.import_module("flows.deploy")
    common: dict = {"entrypoint_type": EntrypointType.MODULE_PATH, "parameters": {"params": params}}
    if for_pool:
        common["job_variables"] = {"working_dir": str(workdir), "env": {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}}
    return [
        this.nightly_flow.to_deployment("nightly", schedule=Cron(cron, timezone=TIMEZONE),
                                   description="dvc repro, then evaluate the latest registered model", **common),
        this.evaluate_latest_flow.to_deployment("evaluate-latest", description="evaluate the newest tapo-policy", **common),
        pipeline_flow.to_deployment("pipeline", description="every stage as a subflow", **common),
    ]


async def ensure_process_pool(name: str) -> None:
    async with get_client() as client:
        try:
            pool = await client.read_work_pool(name)
        except ObjectNotFound:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))
            return
        if pool.type != "process":
            raise SystemExit(f"work pool {name!r} exists with type {pool.type!r}; a 'process' pool is needed")


def parse_args() -> argparse.Namespace:
    return parser().parse_args()


def main() -> None:
    import asyncio

    args = parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    workdir = Path(args.workdir).resolve()
    load_or_exit(workdir / args.params)  # fail on a bad params file before anything is registered
    if args.command == "serve":
        os.chdir(workdir)  # served runs execute in this process's directory
        serve(*deployments(args.params, workdir, args.cron, for_pool=False))
        return
    built = deployments(args.params, workdir, args.cron, for_pool=True)
    asyncio.run(ensure_process_pool(args.pool))
    ids = deploy(*built, work_pool_name=args.pool, print_next_steps_message=False)
    # prefect's async_dispatch types the result as a coroutine too; outside an event loop it is the list of ids
    print(f"deployed {len(ids)} deployments to work pool {args.pool!r}; run: prefect worker start --pool {args.pool}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
