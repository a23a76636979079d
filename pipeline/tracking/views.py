"""How a pipeline run reads in MLflow's UI: its headline numbers as the runs table's first columns.

MLflow 3.17 picks the runs table's columns from a view state (the columns, their order, the charts), which it keeps
in the browser, or, for a view someone shared ("Share" on the experiment page), in the experiment tag
`mlflow.sharedViewState.<key>`, opened by the page's URL parameter `viewStateShareKey=<key>`. So the pipeline
shares one view, `headline`: the headline metrics its parent runs carry (`<stage>/<name>`, copied from each stage's
headline, `flows.tracking`), accuracy and flips first, then the duration, and every link it prints or publishes to
the runs table opens it (`experiment_url`). A column no run has yet stays out of it until one does.

Why the headline lives on the parent as metrics and on a stage run as tags (`HEADLINE_TAG`): MLflow charts a
metric whose every value is at step 0 as a bar, and a run page groups its charts by the key's prefix in alphabetical
order, so the training run's single-value headline (`headline/reward`, ...) stood as a row of bars above its
per-step curves. A parent run has no curves: its metrics are its scalars, where bars compare runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from mlflow import MlflowClient
from mlflow.entities import Run

HEADLINE_VIEW = "headline"
SHARED_VIEW_TAG = "mlflow.sharedViewState."  # MLflow's prefix for a shared view state, the key after it
VIEW_PARAMETER = "viewStateShareKey"
HEADLINE_METRIC = "headline/"  # a stage's headline as the library logs it on the stage run (evaluation: metrics)
HEADLINE_TAG = "headline."  # ... or as tags (training: a run with curves shows no bars above them)
# The order a reader compares in: the policy's accuracy, the baselines', the flips, then tool use and training.
PREFERRED = ("evaluate/accuracy", "evaluate/acc_base", "evaluate/acc_sft", "evaluate/to_right", "evaluate/to_wrong",
             "evaluate/p_value", "evaluate/right_tool", "evaluate/format_error_rate", "train/reward",
             "train/accuracy", "train/format_error_rate", "sft/loss")
MAX_COLUMNS = 12
DURATION_COLUMN = "attributes.`Duration`"


def stage_headline(run: Run) -> dict[str, float]:
    """A stage run's headline numbers, `name -> value`: its `headline/*` metrics and `headline.*` tags."""
    found = {k.removeprefix(HEADLINE_METRIC): v for k, v in run.data.metrics.items() if k.startswith(HEADLINE_METRIC)}
    for key, value in run.data.tags.items():
        if key.startswith(HEADLINE_TAG):
            try:
                found[key.removeprefix(HEADLINE_TAG)] = float(value)
            except ValueError:
                continue  # not a number: not a column
    return found


def headline_tags(values: Mapping[str, float]) -> dict[str, str]:
    """The headline as a stage run's tags (repr: the value exactly)."""
    return {f"{HEADLINE_TAG}{name}": repr(float(value)) for name, value in values.items()}


def columns(metric_keys: Iterable[str]) -> list[str]:
    """The view's columns: the preferred headline metrics present, then the other headline ones (sorted), at most
    MAX_COLUMNS, and the duration; MLflow's column keys (`metrics.\\`key\\``)."""
    present = set(metric_keys)
    ordered = [k for k in PREFERRED if k in present] + sorted(present - set(PREFERRED))
    return [f"metrics.`{key}`" for key in ordered[:MAX_COLUMNS]] + [DURATION_COLUMN]


def view_state(metric_keys: Iterable[str]) -> str:
    """The shared view state MLflow's experiment page reads (its `selectedColumns`; the rest keeps its defaults)."""
    return json.dumps({"selectedColumns": columns(metric_keys)})


def share_headline_view(client: MlflowClient, experiment_id: str, metric_keys: Iterable[str]) -> None:
    """Make the `headline` view show `metric_keys` (a parent's headline metrics) besides the columns it shows."""
    tag = SHARED_VIEW_TAG + HEADLINE_VIEW
    shown = client.get_experiment(experiment_id).tags.get(tag)
    known = set(metric_keys)
    if shown:
        try:
            known |= {c.removeprefix("metrics.`").removesuffix("`") for c in json.loads(shown)["selectedColumns"]
                      if c.startswith("metrics.`")}
        except (ValueError, KeyError, TypeError):
            pass  # a view someone edited by hand into something else: written again
    state = view_state(known)
    if state != shown:
        client.set_experiment_tag(experiment_id, tag, state)


def experiment_url(base: str, experiment_id: str, mode: str) -> str:
    """The runs table of `experiment_id` in the headline view (`mode`: the UI's page switch)."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}?{VIEW_PARAMETER}={HEADLINE_VIEW}&{mode}"
