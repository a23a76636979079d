"""The MLflow UI as a user meets it, in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which setup.sh installs) driven by Selenium, against `mlflow server` started on loopback
over a finished tiny pipeline run (a parent, its train run with per-step metrics and a registered model,
its evaluate run that made that model `champion`).

Checked: the experiment opens on the runs table (not the GenAI overview) showing the parent run by its name;
the stage runs are nested under it; a step-metric chart draws the training reward; the registry shows the
`champion` alias; a training step's trace opens from the experiment's traces view
(`#/experiments/<id>/traces?selectedEvaluationId=<trace id>`, what a click on a trace's row opens) with its span
tree: the group, its trajectories and their turns. Screenshots of each page go to `TAPO_TEST_ARTIFACTS` (default `test-artifacts/mlflow-ui/`).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from flows.tracking import UI_MODE, parent_run, stage_run
from pipeline.evaluation.evaluate import run as evaluate
from pipeline.evaluation.setting import evaluation_setting
from pipeline.evaluation.benchmarks import load_benchmarks
from pipeline.jsonl import write_problems
from pipeline.paths import REPO_ROOT
from pipeline.services.processes import ServiceProcess, free_port
from pipeline.tracking.registry import CHAMPION, MODEL_NAME, update_champion
from pipeline.tracking.runs import PARENT_ENV, STAGE_RUN_ENV, tracked_run
from pipeline.train import run as train
from tests.train.toy_task import build_direct_model, toy_config, toy_problems

pytestmark = pytest.mark.slow
CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT_S = 120  # the UI is a single-page app: on a busy 2-core machine its first render takes a while
PARENT = "tiny-pipeline"

if not (CHROMIUM.is_file() and DRIVER.is_file()):
    pytest.skip(f"no headless browser: {CHROMIUM} or {DRIVER} is missing (Debian packages chromium and "
                "chromium-driver; setup.sh installs them as root)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extras) is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def screenshots_dir() -> Path:
    folder = Path(os.environ.get("TAPO_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts")) / "mlflow-ui"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny pipeline run: parent -> train (2 steps, registered) and evaluate (made the model champion)."""
    root = tmp_path_factory.mktemp("ui")
    cwd = os.getcwd()
    os.chdir(root)  # the SQLite store keeps its artifacts beside the working directory
    try:
        model_dir = build_direct_model(root / "model")
        cfg = toy_config(root, model_dir, group_size=4, steps=3, checkpoints__every=1, lr=1e-3)
        split = root / "test.jsonl"
        write_problems(split, toy_problems(2))
        cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={
            "split_file": str(split), "limit": 2, "mode": "no_tools", "plots": True, "resume": False,
            "output_dir": str(root / "eval"), "model": cfg.train.output_dir})})
        with parent_run(cfg.run, PARENT, {}, {}) as parent_id:
            with stage_run(cfg, "train") as train_id:
                train(cfg, {}, metrics_dir=root / "metrics")
            with stage_run(cfg, "evaluate") as eval_id, tracked_run(cfg.run, "evaluate", {}):
                metrics = evaluate(cfg, {})
            decision = update_champion(cfg.run, cfg.train.output_dir, metrics["all/accuracy"], eval_run_id=eval_id,
                                       setting=evaluation_setting(cfg.evaluate, cfg.rollout.protocol,
                                                                  load_benchmarks(cfg.evaluate)))
        assert decision.promoted, decision
    finally:
        os.chdir(cwd)
        for name in (PARENT_ENV, STAGE_RUN_ENV):
            os.environ.pop(name, None)
    client = MlflowClient(cfg.run.tracking_uri)
    experiment = client.get_experiment_by_name(cfg.run.experiment)
    return {"root": str(root), "uri": cfg.run.tracking_uri, "experiment": experiment.experiment_id,
            "parent": parent_id, "train": train_id, "evaluate": eval_id}


@pytest.fixture(scope="module")
def mlflow_ui(finished_run: dict[str, str]) -> Iterator[str]:
    port = free_port()
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    service = ServiceProcess("mlflow-ui", [mlflow, "server", "--backend-store-uri", finished_run["uri"],
                                           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                             port, Path(finished_run["root"]) / "mlflow-ui.log", health_path="/health")
    previous = os.getcwd()
    os.chdir(finished_run["root"])  # local artifact paths are read from here
    try:
        with service.start(timeout_s=180):
            yield service.url
    finally:
        os.chdir(previous)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def visit(driver: webdriver.Chrome, url: str, *texts: str, shot: Path) -> str:
    """Open `url`, wait until every text is on the page, save a screenshot; the page's text."""
    driver.get(url)
    try:
        WebDriverWait(driver, WAIT_S).until(lambda d: all(t in d.find_element(By.TAG_NAME, "body").text
                                                          for t in texts))
    finally:
        driver.save_screenshot(str(shot))
    return driver.find_element(By.TAG_NAME, "body").text


def test_the_ui_shows_runs_stages_a_step_chart_and_the_champion(finished_run: dict[str, str], mlflow_ui: str,
                                                                 browser: webdriver.Chrome) -> None:
    shots = screenshots_dir()
    base, experiment = mlflow_ui, finished_run["experiment"]
    runs = visit(browser, f"{base}/#/experiments/{experiment}?{UI_MODE}", PARENT, "3 matching runs",
                 shot=shots / "1-runs-table.png")
    assert "Run Name" in runs and "Overview" not in runs  # the runs table, not the GenAI overview
    assert f"{PARENT}/train" not in runs  # one row: the stage runs are folded under their parent
    for stage in ("train", "evaluate"):  # each stage run, nested: its page names the parent
        page = visit(browser, f"{base}/#/experiments/{experiment}/runs/{finished_run[stage]}?{UI_MODE}",
                     "Parent run", PARENT, shot=shots / f"2-{stage}-run.png")
        assert "Parent run" in page
    visit(browser, f"{base}/#/experiments/{experiment}/runs/{finished_run['train']}/model-metrics?{UI_MODE}",
          "headline", shot=shots / "3-train-metrics.png")
    browser.find_element(By.CSS_SELECTOR, "input[placeholder*='Search metric charts']").send_keys("reward/mean")
    shot = shots / "3-train-metrics.png"
    try:  # the per-step chart of the training reward (3 steps): a line with its steps on the x axis
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .scatterlayer"))
    finally:
        browser.save_screenshot(str(shot))
    assert "reward/mean" in browser.find_element(By.TAG_NAME, "body").text
    registry = visit(browser, f"{base}/#/models/{MODEL_NAME}?{UI_MODE}", MODEL_NAME, CHAMPION,
                     shot=shots / "4-registry.png")
    assert "Version 1" in registry
    # a training step's rollouts as a trace (`pipeline.tracking.traces.group_trace`), opened from the experiment's
    # traces view as a click on its row does: the span tree shows the group, its trajectories and their turns
    trace_id, root = training_trace(finished_run)
    page = visit(browser, f"{base}/#/experiments/{experiment}/traces?selectedEvaluationId={trace_id}&traceId={trace_id}",
                 root, "trajectory 0", "turn 1", shot=shots / "5-train-trace.png")
    assert "Spans" in page and trace_id.removeprefix("tr-")[:8] in page
    assert sorted(p.name for p in shots.iterdir()) == ["1-runs-table.png", "2-evaluate-run.png", "2-train-run.png",
                                                      "3-train-metrics.png", "4-registry.png", "5-train-trace.png"]


def training_trace(finished_run: dict[str, str]) -> tuple[str, str]:
    """(trace id, root span name) of one of the train run's traces: a step's group, named `step <n> · <problem> ·
    kept|dropped`."""
    traces = MlflowClient(finished_run["uri"]).search_traces(locations=[finished_run["experiment"]],
                                                             run_id=finished_run["train"])
    assert traces, "the train run logged no traces"
    (root,) = [span.name for span in traces[0].data.spans if span.parent_id is None]
    assert root.startswith("step ") and any(span.name == "trajectory 0" for span in traces[0].data.spans), root
    return traces[0].info.trace_id, root
