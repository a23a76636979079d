"""What a stage flow shows in Prefect's UI: a markdown artifact on its flow run (a stage's report, the training
summary, the evaluation table) linking the stage's MLflow run and the runs table in its headline view."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact

from flows.tracking import run_url, runs_table_url
from pipeline.config.run import RunSection


def markdown_table(values: dict[str, Any]) -> str:
    """| key | value | rows (numbers to 4 significant digits)."""
    rows = [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in values.items()]
    return "\n".join(["| | |", "|---|---|", *rows])


def publish(stage: str, title: str, body: str, run_cfg: RunSection, run_id: str | None) -> None:
    """A markdown artifact on the flow run (Prefect's UI shows it with the run), linking the stage's MLflow run."""
    link = (f"\n\nMLflow run: [{run_id}]({run_url(run_cfg, run_id)}); every run, headline first: "
            f"[runs table]({runs_table_url(run_cfg)})") if run_id else ""
    create_markdown_artifact(f"# {title}\n\n{body}{link}\n", key=f"{stage.replace('_', '-')}-summary",
                             description=title)
