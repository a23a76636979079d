"""The train stage's ranks under `distributed.enabled`: started by the stage's flow, one job, one run.

The flow resolves the placement (`distributed`: ranks per node, nodes, launcher), starts the tool services
once, sized for its ranks, and launches the ranks with `pipeline.distributed.launch` (torchrun, or DeepSpeed's
launcher for a hostfile). Each rank runs `python -m pipeline.train` with `distributed.python` (the stage's
own interpreter, or another environment's: `.venv-vllm` for the vLLM backend on CPU), given the params file,
the services' URLs, the MLflow run the flow opened, the run's plan (`pipeline.training_run.plan`: its folder and
the checkpoint every rank starts from, decided once by the stage) and where its model and metrics go: rank 0
logs into that run and writes the metrics and the model, the others open no run. The ranks' lines stream into
the flow's log as they are printed; a rank failing fails the stage (the launcher stops the rest), and no rank
outlives it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.distributed.launch import RankLayout, lacking, rank_layout, rank_log_tail, root_cause, run_ranks
from pipeline.tracking.runs import STAGE_RUN_ENV
from pipeline.training_run.plan import RunPlan
from pipeline.types import ToolName

RANK_LOG_DIR = Path("logs/train/ranks")
METRICS_DIR = Path("metrics")
SERVICE_URL_KEYS: dict[ToolName, str] = {"code": "sandbox.url", "search": "search.url"}


class RanksFailed(RuntimeError):
    """A rank of the train stage failed (the launcher stopped the others)."""


def stage_layout(cfg: RunConfig, tools: tuple[ToolName, ...]) -> RankLayout | None:
    """Where the stage's ranks run; None when it trains in its own process (`distributed.enabled` false).
    Refuses what cannot work: a stage that is itself one of a launcher's ranks, and services that this node
    would start on loopback for ranks on other nodes."""
    if not cfg.distributed.enabled:
        return None
    if "RANK" in os.environ or "LOCAL_RANK" in os.environ:
        raise SystemExit("the train stage launches its ranks itself (params: distributed.nproc_per_node, nnodes, "
                         "launcher): run `python -m flows.train` (or `dvc repro`) without torchrun or deepspeed")
    where = rank_layout(cfg.distributed)
    needed = ("deepspeed", "mlflow", *cfg.rollout.generation.packages)
    if missing := lacking(where.python, needed):
        whose = "the stage's own Python" if where.python == sys.executable else "distributed.python"
        raise SystemExit(
            f"distributed.enabled{' with rollout.backend vllm' if 'vllm' in missing else ''}: the ranks run with "
            f"{whose} ({where.python}), which lacks {', '.join(missing)}; set distributed.python to an environment "
            "that holds DeepSpeed, MLflow and the rollout backend (on CPU for vllm: .venv-vllm/bin/python, built by "
            "scripts/setup_vllm.sh; docs/scale-out.md)")
    unreachable = [SERVICE_URL_KEYS[t] for t in tools if t in SERVICE_URL_KEYS and not _url(cfg, t)]
    if where.nnodes > 1 and unreachable:
        raise SystemExit(f"distributed.nnodes = {where.nnodes}: ranks on other nodes cannot reach services started "
                         f"on this node's loopback; set {', '.join(unreachable)} to a shared deployment")
    return where


def _url(cfg: RunConfig, tool: ToolName) -> str:
    return cfg.sandbox.url if tool == "code" else cfg.search.url


def rank_program(params: str | Path, urls: Mapping[ToolName, str], plan: RunPlan,
                 metrics_dir: Path = METRICS_DIR, output_dir: Path | None = None) -> list[str]:
    """What every rank runs (after `python`): the library's training, with what the flow set up (the run's plan:
    its folder and the checkpoint it starts from; an ad-hoc run's model and metrics go where the flow placed them)."""
    program = ["-m", "pipeline.train", "--params", str(params), "--metrics-dir", str(metrics_dir)]
    program += ["--output-dir", str(output_dir)] if output_dir is not None else []
    program += [f"--tool-url={tool}={url}" for tool, url in sorted(urls.items())]
    if stage_run := os.environ.get(STAGE_RUN_ENV):
        program += ["--stage-run", stage_run]
    return program + ["--plan", plan.encoded()]


def train_on_ranks(where: RankLayout, params: str | Path, urls: Mapping[ToolName, str], plan: RunPlan,
                   log: Callable[[str], None], *, metrics_dir: Path = METRICS_DIR,
                   output_dir: Path | None = None, log_dir: Path = RANK_LOG_DIR) -> dict[str, float]:
    """Run the training on every rank of `where` and wait; returns the last step's metrics (rank 0's)."""
    ranks = "on the hostfile's nodes" if where.nproc_per_node is None else \
        f"{where.nproc_per_node} rank(s) a node on {where.nnodes} node(s)"
    log(f"train: launching {ranks} with {where.launcher}; rank logs in {log_dir}")
    program = rank_program(params, urls, plan, metrics_dir, output_dir)
    result = run_ranks(program, where, log_dir=log_dir, on_line=log)
    if result.returncode != 0:
        failure = root_cause(result.tail)
        said = rank_log_tail(log_dir, failure.local_rank) if failure else result.tail
        raise RanksFailed(f"train: {failure or 'a rank'} failed first (launcher exit status {result.returncode}); the "
                          f"other ranks were stopped. Rank logs: {result.log_dir}. Its last lines:\n{said}")
    return json.loads((metrics_dir / "train.json").read_text())
