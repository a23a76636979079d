"""A stage whose library opens no MLflow run (prepare-model, curate, build-index): its work inside the stage's
run, which records the config section and the report, and the report published on the flow run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from flows.common import load_or_exit
from flows.summary import markdown_table, publish
from flows.tracking import log_report, stage_run
from pipeline.config import RunConfig

T = TypeVar("T")


def reported_stage(params: str | Path, stage: str, section: str, work: Callable[[Any], T],
                   cfg: RunConfig | None = None, label: str | None = None) -> T:
    """A stage whose library opens no MLflow run (prepare-model, curate, build-index): run
    `work(cfg.<section>)` inside the stage's MLflow run, which records the section and the report. `cfg`: the
    run's config as resolved (an ad-hoc run's outputs placed, flows.outputs), else the params file's; `label`: an
    ad-hoc run's, which names its MLflow run."""
    cfg = load_or_exit(params) if cfg is None else cfg
    part: BaseModel = getattr(cfg, section)
    with stage_run(cfg, stage, label) as run_id:
        report = work(part)
        log_report(cfg.run, run_id, {section: part.model_dump()}, report)
    print(f"{stage}: {report}")
    values = report if isinstance(report, dict) else {"output": report}
    publish(stage, f"{stage}: done", markdown_table({k: v for k, v in values.items() if not isinstance(v, dict)}),
            cfg.run, run_id)
    return report
