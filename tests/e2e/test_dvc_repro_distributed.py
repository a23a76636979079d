"""The train stage on 2 gloo ranks through `dvc repro`: the stage launches its ranks, is one run, and trains the
model one process trains.

In one scratch workspace (the tiny pipeline of `test_dvc_repro`, its train stage's inputs written directly: the
tiny model as the SFT model, calculator problems): `dvc repro --single-item train` in one process, then with
`distributed` at 2 ranks under ZeRO-2, then ZeRO-3 with the hf backend. Each distributed run: both ranks trained (their lines in the stage's log and their log
files), one MLflow train run with the per-step metrics, one dvc.lock entry, the final model equal to the
one-process model within the parity tolerance, and no process of the workspace left.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from mlflow import MlflowClient
from safetensors.torch import load_file

from tests.e2e.test_dvc_repro import TINY, _dvc
from pipeline.jsonl import write_problems
from pipeline.types import Problem
from tests.helpers.workspace import make_workspace, merge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TOLERANCE = 1e-5  # benchmarks/ds_cpu_parity.py's goal in fp32
ONE_PROCESS = merge(yaml.safe_load(yaml.safe_dump(TINY)), {
    "run": {"torch_threads": 1},
    # 2 problems a rank, 2 micro-batches each; the last checkpoint logged whole (every rank's RNG state in it)
    "train": {"sampling": {"prompts_per_step": 4}, "update": {"micro_batch_size": 2}, "checkpoints": {"log_full": True}},
    "distributed": {"collectives": "gloo"},
})
RANKS = {"enabled": True, "nproc_per_node": 2}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_server: str) -> Path:
    os.environ["TAPO_TEST_PREFECT_API_URL"] = prefect_server
    # the ranks load DeepSpeed's CPU op from the checkout's build (compiled once, not per workspace)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(repo_root / ".cache" / "torch_extensions"))
    os.environ["DVC_NO_ANALYTICS"] = "1"  # no forked reporter left behind (it would count as a leftover process)
    ws = make_workspace(tmp_path_factory.mktemp("ws"), repo_root, ONE_PROCESS)
    shutil.copytree(ws / "tiny-model", ws / "models/sft")  # the upstream stages' outputs, as the train stage reads them
    write_problems(ws / "data/curated/train.jsonl", [Problem(f"c{i}", f"What is {i} * 7?", (str(7 * i),), "calculator",
                                                              "calculator", "train") for i in range(12)])
    (ws / "data/search/index").mkdir(parents=True)
    (ws / "data/search/index/README").write_text("unused: calculator problems call the code tool only\n")
    _dvc(ws, "init", "--no-scm", "-q")
    train(ws)
    shutil.copytree(ws / "models/policy", ws.parent / "one_process_policy")
    return ws


def train(ws: Path):
    return _dvc(ws, "repro", "--single-item", "train")


def set_distributed(ws: Path, section: dict) -> None:
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["distributed"] |= section
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def workspace_processes(ws: Path) -> list[str]:
    """Processes running in the workspace (the stage, its launcher, ranks and services all do)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        if proc.info["cwd"] and Path(proc.info["cwd"]).is_relative_to(ws) and proc.info["status"] != "zombie":
            found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or [])[:150]}")
    return found


def max_abs_diff(a: Path, b: Path) -> float:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def train_runs(ws: Path) -> list:
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    experiment = client.get_experiment_by_name(yaml.safe_load((ws / "params.yaml").read_text())["run"]["experiment"])
    return client.search_runs([experiment.experiment_id], "tags.stage = 'train'", order_by=["start_time ASC"])


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_the_train_stage_on_two_ranks_is_one_run_and_trains_the_one_process_model(workspace: Path,
                                                                                   zero_stage: int) -> None:
    ws, runs_before = workspace, len(train_runs(workspace))
    set_distributed(ws, RANKS | {"zero_stage": zero_stage})
    out = train(ws)
    log = out.stdout + out.stderr
    assert "Running stage 'train'" in log
    steps = TINY["train"]["steps"]
    for step in range(1, steps + 1):  # both ranks trained every step, each on its share, and said so in the log
        shares = [re.search(rf"\[rank{r}\]:rank {r} of 2: step {step}: trained on (\d+) of 4 groups", log)
                  for r in (0, 1)]
        assert all(shares), log[-4000:]
        assert sum(int(m.group(1)) for m in shares) == 4  # every group trained once, on one rank
    rank_logs = sorted((ws / "logs/train/ranks").rglob("stderr.log"))
    assert len(rank_logs) >= 2 and all("trained on" in p.read_text() for p in rank_logs[-2:])

    runs = train_runs(ws)
    assert len(runs) == runs_before + 1  # one MLflow run for the stage, not one per rank
    run = runs[-1]
    assert run.info.status == "FINISHED" and run.data.params["distributed.zero_stage"] == str(zero_stage)
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == list(range(steps))  # per-step metrics, logged once (rank 0)
    saved = [Path(f.path).name for f in client.list_artifacts(run.info.run_id, "checkpoints")]
    assert saved == ["run_config.json", "step-000001", "step-000002"]  # DeepSpeed's are complete ones too (state.json)
    assert {"state.json", "rng_rank000.pt", "rng_rank001.pt"} <= {
        Path(f.path).name for f in client.list_artifacts(run.info.run_id, "checkpoints/step-000002")}
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
    assert list(lock).count("train") == 1
    assert lock["train"]["params"]["params.yaml"]["distributed"]["zero_stage"] == zero_stage
    assert "models/policy" in {out["path"] for out in lock["train"]["outs"]}

    assert max_abs_diff(ws / "models/policy", ws / "models/sft") > 10 * TOLERANCE  # trained: the check below bites
    assert max_abs_diff(ws / "models/policy", ws.parent / "one_process_policy") <= TOLERANCE
    assert workspace_processes(ws) == []  # ranks, launcher, services: all gone with the stage
    assert torch.isfinite(torch.tensor(run.data.metrics["train/grad_norm"]))
