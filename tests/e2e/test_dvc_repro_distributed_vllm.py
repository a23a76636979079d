"""The train stage with `rollout.backend: vllm` on gloo ranks through `dvc repro`: the stage (this environment, which
has no vLLM) runs its ranks in the vLLM environment (`distributed.python`), each rank samples from its own colocated
engine and pushes its trained weights into it, and the run is one run that trains what one rank trains.

One scratch workspace (the tiny pipeline of `test_dvc_repro_distributed`, with a tiny model vLLM's CPU kernels take):
`dvc repro --single-item train` on 1 rank under ZeRO-2, then on 2 ranks under ZeRO-3, whose weights reach the engines
gathered from the ranks' shards. The 2-rank run: both ranks trained every step (their lines in the stage's log), one
MLflow train run with per-step metrics, one dvc.lock entry, the final model equal to the 1-rank model within the
parity tolerance, and no process of the workspace left.
The reference is 1 rank and not the stage's own process: that process would need vLLM in the stage's environment.
Skipped where the vLLM environment is absent (TAPO_VLLM_PYTHON, or .venv-vllm built by scripts/setup_vllm.sh).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from mlflow import MlflowClient

from pipeline.distributed.launch import lacking
from pipeline.jsonl import write_problems
from pipeline.types import Problem
from tests.e2e.test_dvc_repro import _dvc
from tests.e2e.test_dvc_repro_distributed import (ONE_PROCESS, TOLERANCE, max_abs_diff, set_distributed, train_runs,
                                                  workspace_processes)
from tests.helpers.workspace import make_workspace, merge
from tests.helpers.tiny import tiny_tokenizer
from tests.helpers.vllm_env import VLLM_PYTHON
from tests.vllm.tiny_vllm import load_tiny, save_tiny

RANKS_READY = VLLM_PYTHON.is_file() and not lacking(str(VLLM_PYTHON), ("vllm", "deepspeed", "mlflow"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800),
              pytest.mark.skipif(not RANKS_READY,
                                 reason=f"no vLLM environment with DeepSpeed and MLflow at {VLLM_PYTHON} "
                                        "(scripts/setup_vllm.sh)")]

WITH_VLLM = merge(yaml.safe_load(yaml.safe_dump(ONE_PROCESS)), {
    "rollout": {"backend": "vllm", "max_total_tokens": 1024},
    "distributed": {"enabled": True, "python": str(VLLM_PYTHON), "zero_stage": 2},
})


def ending_often(path: Path) -> None:
    """Make the random model end about one token in ten with EOS, so that a group's samples differ in reward
    (ended without an answer, or cut at the token limit) and the update has something to learn: one dimension of
    every token's embedding is a constant, which the final norm keeps nearly constant, and only EOS reads it."""
    model, eos = load_tiny(path), tiny_tokenizer().eos_token_id
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.05
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[eos, 0] = 2.0
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, repo_root: Path, prefect_server: str) -> Path:
    os.environ["TAPO_TEST_PREFECT_API_URL"] = prefect_server
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(repo_root / ".cache" / "torch_extensions"))
    os.environ["DVC_NO_ANALYTICS"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: two engines on a small machine
    ws = make_workspace(tmp_path_factory.mktemp("ws"), repo_root, WITH_VLLM)
    ending_often(save_tiny(ws / "models/sft", seed=0, positions=2048, logit_scale=1.0))  # head_dim 64 for vLLM's CPU kernels
    write_problems(ws / "data/curated/train.jsonl", [Problem(f"c{i}", f"What is {i} * 7?", (str(7 * i),), "calculator",
                                                              "calculator", "train") for i in range(12)])
    (ws / "data/search/index").mkdir(parents=True)
    (ws / "data/search/index/README").write_text("unused: calculator problems call the code tool only\n")
    _dvc(ws, "init", "--no-scm", "-q")
    set_distributed(ws, {"nproc_per_node": 1})
    _dvc(ws, "repro", "--single-item", "train")
    shutil.copytree(ws / "models/policy", ws.parent / "one_rank_policy")
    return ws


def test_the_vllm_backend_trains_on_two_ranks_in_its_own_environment_as_one_run(workspace: Path) -> None:
    ws, runs_before = workspace, len(train_runs(workspace))
    set_distributed(ws, {"nproc_per_node": 2, "zero_stage": 3})
    out = _dvc(ws, "repro", "--single-item", "train")
    log = out.stdout + out.stderr
    assert "launching 2 rank(s) a node on 1 node(s) with torchrun" in log
    steps = ONE_PROCESS["train"]["steps"]
    for step in range(1, steps + 1):  # both ranks trained every step, each on its share
        shares = [re.search(rf"\[rank{r}\]:rank {r} of 2: step {step}: trained on (\d+) of 4 groups", log)
                  for r in (0, 1)]
        assert all(shares), log[-4000:]
        assert sum(int(m.group(1)) for m in shares) == 4
    rank_logs = [p.read_text() for p in sorted((ws / "logs/train/ranks").rglob("stderr.log"))[-2:]]
    assert len(rank_logs) == 2 and all("trained on" in text for text in rank_logs)

    runs = train_runs(ws)
    assert len(runs) == runs_before + 1  # one MLflow run for the stage
    run = runs[-1]
    assert run.info.status == "FINISHED" and run.data.params["rollout.backend"] == "vllm"
    client = MlflowClient(f"sqlite:///{ws / 'mlruns.db'}")
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == list(range(steps))
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
    assert list(lock).count("train") == 1
    assert lock["train"]["params"]["params.yaml"]["distributed"]["nproc_per_node"] == 2
    assert run.data.params["distributed.zero_stage"] == "3"

    assert max_abs_diff(ws / "models/policy", ws.parent / "one_rank_policy") <= TOLERANCE
    assert max_abs_diff(ws / "models/policy", ws / "models/sft") > 10 * TOLERANCE  # trained: the check above bites
    assert workspace_processes(ws) == []  # ranks, engines, launcher, services: all gone with the stage
