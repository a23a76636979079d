"""The whole pipeline through `dvc repro`, on a tiny model, in a scratch workspace.

Checks the acceptance points of the pipeline: every stage runs through its Prefect flow and
writes its metrics; the `dvc repro` gets one MLflow parent run with one nested run per stage,
tagged with the inputs dvc.lock records, and the train run holds its checkpoints; a second
`dvc repro` runs nothing; changing one param re-runs only the stages that read it, down to one of the three
evaluations, and so does `dvc exp run -S` (the workspace is a git repository, as experiments need).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import termios
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient

from flows.tracking import INVOCATION_TAG
from pipeline.tracking.runs import DVC_TAG_PREFIX
from tests.helpers.recipe import PLAIN_RECIPE, nested
from tests.helpers.workspace import make_workspace, merge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a whole tiny pipeline, three evaluations

TINY = merge(nested(PLAIN_RECIPE), {
    "model": {"path": "tiny-model"},
    "curate": {"calculator": {"n_train": 12, "n_test": 4}},
    "rollout": {"group_size": 2, "max_policy_tokens": 12, "max_total_tokens": 2048, "max_batch_sequences": 4},
    # dynamic sampling off: a random tiny model earns equal rewards, and the step must still run
    "train": {"steps": 2, "algorithm": {"kind": "dapo", "dynamic_sampling": False},
              "sampling": {"prompts_per_step": 2, "max_gen_rounds": 1, "refill_dropped_groups": False,
                           "anchor_dropped_tokens": 0},
              "checkpoints": {"every": 1}, "optimizer": {"lr": 1e-4}},
    "evaluate": {"limit": 4},
})


def _dvc(workspace: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    dvc = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PREFECT_API_URL": os.environ.get("TAPO_TEST_PREFECT_API_URL", "")}
    result = subprocess.run([str(dvc), *args], cwd=workspace, capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, f"dvc {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_server: str) -> Path:
    # One Prefect server for all stages instead of a temporary one per stage process.
    os.environ["TAPO_TEST_PREFECT_API_URL"] = prefect_server
    ws = make_workspace(tmp_path_factory.mktemp("ws"), repo_root, TINY)
    git = ["git", "-c", "user.name=tapo-test", "-c", "user.email=tapo-test@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=ws, check=True)
    _dvc(ws, "init", "-q")
    # the repository's ignore rules (what the stages write beside their results), and the scratch model
    (ws / ".gitignore").write_text((repo_root / ".gitignore").read_text() + "\ntiny-model/\n")
    subprocess.run([*git, "add", "-A"], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tiny workspace"], cwd=ws, check=True)
    return ws


def _pipeline_runs(ws: Path) -> tuple[MlflowClient, list]:
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    experiment = client.get_experiment_by_name(yaml.safe_load((ws / "params.yaml").read_text())["run"]["experiment"])
    parents = client.search_runs([experiment.experiment_id], "tags.stage = 'pipeline'", order_by=["start_time ASC"])
    return client, parents


def _stage_runs(client: MlflowClient, parent) -> dict:
    runs = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    stages = {r.data.tags["stage"]: r for r in runs}
    assert len(stages) == len(runs), "more than one run for a stage"
    return stages


def test_repro_runs_every_stage(workspace: Path) -> None:
    _dvc(workspace, "repro")
    train = json.loads((workspace / "metrics/train.json").read_text())  # diagnostics: the last step's every metric
    evaluation = json.loads((workspace / "metrics/eval.json").read_text())
    assert "reward/mean" in train and "train/grad_norm" in train
    # evaluate.limit is per benchmark: the held-out calculator problems and the Wikipedia fact questions
    assert evaluation["n_problems"] == 8 and 0.0 <= evaluation["all/accuracy"] <= 1.0
    compared = json.loads((workspace / "metrics/eval_compare.json").read_text())  # base, SFT and RL side by side
    assert compared["order"] == ["base (tools)", "SFT (tools)", "SFT + DAPO (tools)"]
    assert compared["flips"]["problems"] == 8 and compared["flips"]["before"] == "SFT (tools)"
    assert all(compared["models"][m]["all"]["n_problems"] == 8 for m in compared["order"])
    headline = {s: json.loads((workspace / f"metrics/headline/{s}.json").read_text()) for s in ("train", "eval")}
    final = json.loads((workspace / "metrics/train_final.json").read_text())  # the last quarter's means
    assert final["steps"] == 2 and {"reward", "accuracy", "format_error_rate"} <= final.keys()
    assert headline["train"] == {"reward": final["reward"]}
    assert headline["eval"].keys() == {"accuracy", "right_tool", "acc_base", "acc_sft", "to_right", "to_wrong", "p_value"}
    assert headline["eval"]["accuracy"] == evaluation["all/accuracy"]
    assert headline["eval"]["acc_sft"] == compared["models"]["SFT (tools)"]["all"]["accuracy"]
    assert (workspace / "models/policy/config.json").is_file()
    curve = (workspace / "metrics/train_curve.csv").read_text().splitlines()
    assert len(curve) == 1 + TINY["train"]["steps"]
    assert (workspace / "metrics/train_curve.png").is_file() and (workspace / "metrics/eval_plots/accuracy.png").is_file()
    client, (parent,) = _pipeline_runs(workspace)
    assert parent.info.status == "FINISHED" and INVOCATION_TAG in parent.data.tags
    assert parent.info.run_name.startswith("dvc-repro-")
    assert {"train/reward", "train/accuracy", "evaluate/accuracy"} <= parent.data.metrics.keys()
    stages = _stage_runs(client, parent)
    assert stages.keys() == {"prepare-model", "curate", "build-index", "sft", "train", "evaluate-base", "evaluate-sft",
                             "evaluate"}
    assert all(run.info.run_name == name for name, run in stages.items())  # the parent names the pipeline
    lock = yaml.safe_load((workspace / "dvc.lock").read_text())["stages"]
    for name, run in stages.items():
        tagged = {k.removeprefix(DVC_TAG_PREFIX): v for k, v in run.data.tags.items() if k.startswith(DVC_TAG_PREFIX)}
        assert tagged == {d["path"]: d["md5"] for d in lock[name]["deps"]}, name
        assert run.info.status == "FINISHED" and run.data.tags["git_commit"] == parent.data.tags["git_commit"]
    assert stages["evaluate"].data.metrics["eval/n_problems"] == 8
    train = stages["train"].info.run_id
    saved = [Path(f.path).name for f in client.list_artifacts(train, "checkpoints")]
    assert saved == ["run_config.json", "step-000001", "step-000002"]  # checkpoints.every 1, the last 2 kept
    for step in saved[1:]:  # metadata only by default (train.checkpoints.log_full: the last one whole)
        files = [Path(f.path).name for f in client.list_artifacts(train, f"checkpoints/{step}")]
        assert files == ["manifest.json", "state.json"]
    (version,) = client.search_model_versions("name = 'tapo-policy'")
    logged = client.get_logged_model(version.source.removeprefix("models:/"))
    assert logged.source_run_id == train and version.tags["train.steps"] == "2", "final model not logged"


def test_what_the_stages_write_is_a_result_or_ignored(workspace: Path) -> None:
    """After `dvc repro` and `dvc plots show`, git sees only results to commit: dvc.lock and the metrics files
    DVC does not cache; checkpoints, logs, MLflow's store, plots' HTML are ignored."""
    _dvc(workspace, "plots", "show")
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=workspace,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    untracked = sorted(line[3:] for line in status if line.startswith("??"))
    stray = [p for p in untracked if p != "dvc.lock" and not p.startswith("metrics/")
             and not p.endswith("/.gitignore")]  # DVC's own entries for the outputs it caches
    assert not stray, f"written by the pipeline but neither a result nor ignored: {stray}"
    assert "metrics/headline/eval.json" in untracked and "metrics/eval_samples.jsonl" not in untracked
    diff = _dvc(workspace, "metrics", "diff").stdout
    assert "headline/eval.json" in diff and "accuracy" in diff


def test_second_repro_runs_nothing(workspace: Path) -> None:
    out = _dvc(workspace, "repro").stdout
    assert "Running stage" not in out, out
    assert len(_pipeline_runs(workspace)[1]) == 1, "a dvc repro that ran no stage opened a parent run"


def _ran(out: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", out))


def test_changing_one_param_reruns_only_its_stages(workspace: Path) -> None:
    """The policy's row label is read by the `evaluate` stage alone: its sibling evaluations stay cached."""
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["evaluate"]["label"] = "RL policy"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _dvc(workspace, "repro").stdout
    assert _ran(out) == {"evaluate"}, out
    compared = json.loads((workspace / "metrics/eval_compare.json").read_text())
    assert compared["order"] == ["base (tools)", "SFT (tools)", "RL policy"]
    assert json.loads((workspace / "metrics/eval.json").read_text())["n_problems"] == 8


def test_exp_run_with_a_param_set_reruns_only_its_stages(workspace: Path) -> None:
    """A baseline's label: its evaluation and the comparison re-run, nothing else."""
    out = _dvc(workspace, "exp", "run", "-S", "evaluate.baselines.sft.label=SFT-only").stdout
    assert _ran(out) == {"evaluate-sft", "evaluate"}, out
    compared = json.loads((workspace / "metrics/eval_compare.json").read_text())
    assert compared["order"] == ["base (tools)", "SFT-only", "RL policy"]
    assert yaml.safe_load((workspace / "params.yaml").read_text())["evaluate"]["baselines"]["sft"]["label"] == "SFT-only"
    listed = _dvc(workspace, "exp", "ls", "--name-only").stdout.split()
    assert len(listed) == 1, f"expected one experiment, got {listed}"
    client, parents = _pipeline_runs(workspace)
    assert "dvc.dvc_exp_baseline_rev" in parents[-1].data.tags
    assert parents[-1].info.run_name == listed[0]  # the parent is named after the DVC experiment
    assert _stage_runs(client, parents[-1]).keys() == {"evaluate-sft", "evaluate"}


HEADLINE_KEYS = ("reward", "accuracy", "right_tool", "acc_base", "acc_sft", "to_right", "to_wrong", "p_value")
# docs/experiments.md's column filter: anchored, as `--keep reward` alone also keeps every `reward.*` parameter
SHOWN_IN_EXP = "^(Experiment|reward|accuracy|right_tool|acc_.*|to_right|to_wrong|p_value)$"


def _in_a_terminal(workspace: Path, args: tuple[str, ...], columns: int) -> str:
    """What `dvc <args>` shows on a terminal `columns` wide (a pseudo-terminal of that size; DVC lays its tables out
    for the terminal it finds, and for 80 columns when it finds none), colours removed."""
    dvc = Path(sys.executable).with_name("dvc")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "TERM": "xterm",
           "COLUMNS": str(columns), "LINES": "60"}  # as a terminal's shell sets them (a test runner may set others)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    process = subprocess.Popen([str(dvc), *args], cwd=workspace, stdin=follower, stdout=follower, stderr=follower,
                               env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command has ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace")).replace("\r", "")


def test_the_headline_numbers_fit_a_terminal(workspace: Path) -> None:
    """On a terminal 120 columns wide, `dvc metrics show` and `dvc exp show` (its metrics, as docs/experiments.md
    runs it) print every headline number whole: the detail is plain outputs, not DVC metrics."""
    for args in (("metrics", "show"),
                 ("exp", "show", "--no-pager", "--drop", ".*", "--keep", SHOWN_IN_EXP)):
        shown = _in_a_terminal(workspace, args, columns=120)
        print(f"$ dvc {' '.join(args)}\n{shown}")
        assert max(len(line) for line in shown.splitlines()) <= 120, shown
        assert all(key in shown for key in HEADLINE_KEYS), shown
        assert "…" not in shown, shown  # no column cut to fit
