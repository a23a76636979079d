"""Stage train: RL with tools (DAPO by default) from the base or SFT model.

    python -m flows.train --params params.yaml [--resume]        # the DVC stage: models/policy, metrics/
    python -m flows.train --params other.yaml [--label NAME]     # ad hoc: runs/train/<label>/ (flows.outputs)

It trains in this process, or under `distributed.enabled` on the ranks the flow launches (`flows.ranks`: the
placement comes from params; the services start once, here, and every rank is given their URLs, the run's
plan and where its model and metrics go).

Each run keeps its checkpoints in its own folder, `<train.checkpoints.dir>/<run>/checkpoints`: the run is
named after the DVC experiment (`DVC_EXP_NAME`, set by `dvc exp run`), an ad-hoc run after its label,
otherwise after a digest of its training config (`pipeline.training_run.folder`); `--resume` refuses that
folder's checkpoints when they were written under another config. The stage plans the run once
(`pipeline.training_run.plan`: its folder, whether and from which checkpoint it resumes) and hands the plan to
the recipe, in this process or on every rank.

The trainer logs into the stage's MLflow run, nested under the parent run of this `dvc repro` (flows.tracking). A
resumed training's run is new too, never the killed attempt's reopened: the trainer logs into it the steps before
the checkpoint from the run's history and then its own, so it holds every step once, and tags it with the run it
continues (pipeline.tracking.runs). Which checkpoint it continues from, or why it stops, is decided before Prefect
starts (`preflight` makes the plan the flow then runs), so a damaged checkpoint or a lost history ends the stage
with one line naming the file. Afterwards the metadata of the checkpoints this run saved (`state.json`, and the config they were written
under) is logged into it too; the last checkpoint whole (weights, optimiser, RNG) only with
`train.checkpoints.log_full`, since it weighs ~3x the model. The final model is logged and registered by
the trainer (`pipeline.tracking.registry`).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("train")

import json
import os
import time
from pathlib import Path

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.common import USER_ERRORS as COMMON_ERRORS
from flows.common import load_or_exit, tools_needed
from flows.outputs import Placement, placement
from flows.ranks import stage_layout, train_on_ranks
from flows.summary import markdown_table, publish
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import RunConfig
from pipeline.distributed.launch import RankLayout
from pipeline.outputs import OutputNotWritable
from pipeline.tracking.headline import final_file, final_line
from pipeline.tracking.history import HistoryGap
from pipeline.tracking.registry import MODEL_NAME, find_version, quiet_progress_unless_tty
from pipeline.tracking.runs import log_checkpoints
from pipeline.data.answerable import search_probes
from pipeline.data.broken import BrokenDependency
from pipeline.sampling.training_problems import BadProblems, read_training_problems
from pipeline.train import run as train
from pipeline.training_run.checkpoint import TornCheckpoints, is_complete, read_state
from pipeline.training_run.folder import CHECKPOINTS, RUN_CONFIG, ConfigMismatch
from pipeline.training_run.plan import RunPlan, plan_run
from pipeline.training_run.resume_point import UnusableCheckpoints

USER_ERRORS = (*COMMON_ERRORS, ConfigMismatch, TornCheckpoints, UnusableCheckpoints, HistoryGap, BadProblems,
               OutputNotWritable, BrokenDependency)


@task(cache_policy=NO_CACHE)
def train_task(cfg: RunConfig, urls: dict, plan: RunPlan, metrics_dir: Path) -> dict:
    return train(cfg, urls, plan, metrics_dir=metrics_dir)


@task(cache_policy=NO_CACHE)
def ranks_task(where: RankLayout, cfg: RunConfig, params: str, urls: dict, plan: RunPlan, metrics_dir: Path) -> dict:
    return train_on_ranks(where, params, urls, plan, get_run_logger().info, metrics_dir=metrics_dir,
                          output_dir=Path(cfg.train.output_dir))


def run_name(place: Placement) -> str | None:
    """An ad-hoc run's label, else the DVC experiment's name, else None (the config's digest names it)."""
    return place.label or os.environ.get("DVC_EXP_NAME") or None


def placed_config(cfg: RunConfig, place: Placement) -> RunConfig:
    """`cfg` with the final model where this run writes it (flows.outputs: ad hoc, under runs/train/<label>/)."""
    output_dir = str(place.place(cfg.train.output_dir))
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"output_dir": output_dir})})


def checkpoints_of_run(run_dir: Path, run_ids: set[str | None], started: float) -> list[Path]:
    """The complete checkpoints this run saved: written since `started`, or (a resume that had nothing left
    to train) saved by the attempt it continues (`run_ids`: this run's and that one's). Not those of an earlier
    training."""
    return sorted(p for p in (run_dir / CHECKPOINTS).glob("step-??????") if is_complete(p)
                  and (p.stat().st_mtime >= started or _saved_by(p) in run_ids - {None}))


def _saved_by(checkpoint: Path) -> str | None:
    try:
        return read_state(checkpoint).mlflow_run_id
    except ValueError:
        return None


def log_run_checkpoints(cfg: RunConfig, run_id: str, run_dir: Path, started: float, earlier: str | None) -> list[str]:
    """Every checkpoint's metadata and the config they were written under; the last one whole on request."""
    quiet_progress_unless_tty()
    full = 1 if cfg.train.checkpoints.log_full else 0
    logged = log_checkpoints(cfg.run, run_id, checkpoints_of_run(run_dir, {run_id, earlier}, started), full=full)
    if (run_dir / RUN_CONFIG).is_file():
        MlflowClient(cfg.run.tracking_uri).log_artifact(run_id, str(run_dir / RUN_CONFIG), CHECKPOINTS)
    return logged


def stage_plan(cfg: RunConfig, place: Placement, resume: bool) -> RunPlan:
    """The run's plan (`pipeline.training_run.plan`): `--resume` insists, otherwise `train.checkpoints.resume` decides (auto:
    an interrupted attempt of this very run, same config, code and data, is continued)."""
    return plan_run(cfg, name=run_name(place), metrics_dir=place.place("metrics"),
                    mode="insisted" if resume else cfg.train.checkpoints.resume)


# The plan `preflight` made, by the flow's arguments, for the flow it precedes in the same process: a stage plans its
# run once, and the one decision it printed and acted on (checkpoints a resume passes over are set aside) is run.
_PLANNED: dict[tuple[str, bool, str | None, str | None], RunPlan] = {}


def preflight(params: str, resume: bool = False, label: str | None = None, out: str | None = None) -> None:
    """The mistakes a user can fix, found before Prefect starts: an unreadable problems file, a resume of
    checkpoints written under another config, a resume whose checkpoint or history does not verify. The run is
    planned here (the checkpoints passed over are set aside, once), and the flow runs that plan."""
    place = placement("train", params, label=label, out=out, ad_hoc=False)
    cfg = placed_config(load_or_exit(params), place)
    read_training_problems(cfg.train.train_file, cfg.train.sampling.max_train_problems)
    _PLANNED[(params, resume, label, out)] = stage_plan(cfg, place, resume)


def flow_plan(cfg: RunConfig, place: Placement, key: tuple[str, bool, str | None, str | None]) -> RunPlan:
    """The plan `preflight` made for the flow called with `key` (params, resume, label, out), else one made now:
    a flow started without it (the pipeline's flow, a deployment)."""
    return _PLANNED.pop(key, None) or stage_plan(cfg, place, key[1])


@flow(name="train", log_prints=True)
def train_flow(params: str = "params.yaml", resume: bool = False, label: str | None = None,
               out: str | None = None) -> dict:
    place = placement("train", params, label=label, out=out, ad_hoc=False)
    cfg = placed_config(load_or_exit(params), place)
    tools = tools_needed(cfg.train.train_file)
    where = stage_layout(cfg, tools)  # None: train in this process
    plan = flow_plan(cfg, place, (params, resume, label, out))
    if plan.mode == "auto":
        print(f"train: {plan.reason}", flush=True)
    run_dir, metrics_dir = plan.folder, place.place("metrics")
    earlier = _saved_by(plan.start_from) if plan.start_from else None  # the attempt it continues (its run is new)
    started = time.time() - 1.0  # file times may be rounded down
    with stage_run(cfg, "train", place.label) as run_id:
        probe = search_probes([p for _, p in read_training_problems(cfg.train.train_file,
                                                                    cfg.train.sampling.max_train_problems)])
        with running_services(cfg, tools, params, ranks=where.local_ranks if where else 1,
                              search_probe=probe, stage="train") as urls:
            metrics = ranks_task(where, cfg, params, urls, plan, metrics_dir) if where else \
                train_task(cfg, urls, plan, metrics_dir)
        if run_id is not None:
            logged = log_run_checkpoints(cfg, run_id, run_dir, started, earlier)
            print(f"checkpoints in {run_dir / CHECKPOINTS}; their metadata logged to MLflow run {run_id}: {logged}")
    final = final_line(json.loads(final_file(metrics_dir).read_text())) if run_id is not None else "trained"
    print(f"{final}; model {cfg.train.output_dir}, metrics {metrics_dir}")  # final: the headline's, not the last step
    if run_id is not None:  # the main process (the others record nothing)
        publish("train", f"train: {run_dir.name}", training_summary(cfg, run_dir, metrics_dir), cfg.run, run_id)
    return metrics


def training_summary(cfg: RunConfig, run_dir: Path, metrics_dir: Path) -> str:
    """The run in a few lines: what trained, where everything went, the headline numbers, the registered version."""
    tc = cfg.train
    headline = json.loads(final_file(metrics_dir).read_text())
    version = find_version(cfg.run, tc.output_dir)
    registered = f"`{MODEL_NAME}` v{version.version}" if version is not None else "not registered"
    return "\n".join([
        f"{tc.algorithm.kind} ({tc.finetune.kind}) for {tc.steps} steps from `{tc.init_model}` on `{tc.train_file}`.",
        "", f"* final model: `{tc.output_dir}` ({registered})", f"* checkpoints: `{run_dir / CHECKPOINTS}`",
        f"* metrics: `{metrics_dir}`", "",
        f"Mean over the last {headline['averaged_steps']:.0f} of {headline['steps']:.0f} steps:", "",
        markdown_table({k: v for k, v in headline.items() if k not in ("steps", "averaged_steps")})])
