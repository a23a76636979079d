"""Shared by the stage flows: command-line handling, params validation, the shape of a reported stage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from flows.tracking import log_report, stage_run
from pipeline.config import DEFAULT_PARAMS, ConfigError, RunConfig, load_config
from pipeline.jsonl import read_problems
from pipeline.rollout.protocol import TOOLS_FOR_TYPE
from pipeline.types import ToolName

T = TypeVar("T")


def stage_args(description: str, *, resume: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)")
    if resume:
        parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    return parser.parse_args()


def load_or_exit(params: str | Path) -> RunConfig:
    """Validate the params file before any flow starts; print every error and exit 1 on failure."""
    try:
        return load_config(params)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(1) from None


def tools_needed(problem_file: str | Path) -> tuple[ToolName, ...]:
    """The tools the problems in a file may call (from their types)."""
    types = {p.type for p in read_problems(problem_file)}
    return tuple(sorted({tool for t in types for tool in TOOLS_FOR_TYPE.get(t, ())}))


def run_stage(flow_fn: Callable[..., object], description: str, *, resume: bool = False) -> None:
    """`python -m flows.<stage>`: validate the params file before Prefect starts, then run the flow."""
    args = stage_args(description, resume=resume)
    load_or_exit(args.params)
    flow_fn(args.params, **({"resume": args.resume} if resume else {}))


def reported_stage(params: str | Path, stage: str, section: str, work: Callable[[Any], T]) -> T:
    """A stage whose library opens no MLflow run (prepare-model, curate, build-index): run
    `work(cfg.<section>)` inside the stage's MLflow run, which records the section and the report."""
    cfg = load_or_exit(params)
    part: BaseModel = getattr(cfg, section)
    with stage_run(cfg, stage) as run_id:
        report = work(part)
        log_report(cfg.run, run_id, {section: part.model_dump()}, report)
    print(f"{stage}: {report}")
    return report
