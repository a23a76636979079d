"""The matrix's vLLM sample: rows of the pairwise cover (`cases.vllm_rows`) sampled by `rollout.backend: vllm`
in the vLLM environment (tests/matrix/vllm_rollout.py; that environment holds the rollout's dependencies
only), then scored, filtered and trained on for one step in this one, with the matrix's invariants on the
records vLLM produced. Skipped where the vLLM environment is absent (TAPO_VLLM_PYTHON, or .venv-vllm)."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import pytest
import yaml

from pipeline.rl.anchor import step_openings
from pipeline.sampling.dynamic_sampling import group_reward
from pipeline.paths import REPO_ROOT
from tests.helpers.vllm_env import VLLM_PYTHON
from pipeline.train import prepared_batch, set_up, update
from tests.matrix.cases import (check_dropped_have_zero_advantage, check_dropped_rows_of_the_batch_train_nothing,
                                check_metrics, check_rewards, check_tool_output_gets_no_gradient, pairwise_rows,
                                row_id, vllm_rows)
from tests.matrix.conftest import row_config
from tests.matrix.toy_protocols import TASKS, build_protocol_model

pytestmark = [pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"no vLLM environment at {VLLM_PYTHON}"),
              pytest.mark.timeout(900)]


def vllm_model(vocab_size: int):
    from tests.vllm.tiny_vllm import tiny_model
    return tiny_model(vocab_size, seed=0)  # head_dim 64: the CPU build's attention kernels need it


@pytest.mark.slow
@pytest.mark.parametrize("row", vllm_rows(pairwise_rows()), ids=row_id)
def test_one_step_on_vllm_rollouts(row: dict[str, str], tmp_path: Path, tool_urls: dict[str, str]) -> None:
    task, url = TASKS[row["protocol"]], tool_urls[row["protocol"]]
    probe = row_config(row, tmp_path, tmp_path, url)
    model_dir = build_protocol_model(tmp_path / "model", task, probe, url, new_model=vllm_model, lr=1e-3)
    cfg_vllm = row_config(row, tmp_path, model_dir, url, **{"rollout.backend": "vllm"})
    params = tmp_path / "vllm-params.yaml"
    params.write_text(yaml.safe_dump(cfg_vllm.model_dump(mode="json"), sort_keys=False))
    out = tmp_path / "groups.pkl"
    env = dict(os.environ) | {"PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([str(VLLM_PYTHON), "-m", "tests.matrix.vllm_rollout", str(params), task.tool, url, str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    tr = set_up(row_config(row, tmp_path, model_dir, url), {task.tool: url})  # the trainer side
    try:
        for groups in pickle.loads(out.read_bytes()):  # a collection that keeps nothing is a skipped step
            scored = [group_reward(cfg_vllm.reward, cfg_vllm.rollout, tr.tepo)(g) for g in groups]
            kept = [g for g in scored if tr.keep(g)]
            dropped = [g for g in scored if not tr.keep(g)]
            anchored = step_openings(kept, dropped, tr.cfg.train.sampling.anchor_dropped_tokens)
            check_rewards(cfg_vllm, scored)
            check_dropped_have_zero_advantage(tr, dropped, anchored)
            if kept:
                break
        assert kept, "no informative group in the vLLM collections"
        batch, _ = prepared_batch(tr, kept + anchored)
        old = batch.old_logprobs_BT[batch.loss_mask_BT == 1]
        assert bool((old.isfinite() & (old <= 0)).all()) and bool((old < 0).any())  # real log-probs
        check_dropped_rows_of_the_batch_train_nothing(batch, kept + anchored, anchored)
        check_tool_output_gets_no_gradient(tr, batch, kept + anchored)
        check_metrics(tr.cfg, update(tr, kept, anchored))
    finally:
        tr.engine.close()
