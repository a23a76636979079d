"""The trainer of `pipeline.train`, unchanged, on 2 gloo ranks with DeepSpeed ZeRO-3 (CPU)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from pipeline.distributed.launch import launch
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


def write_run(tmp: Path, repo_root: Path) -> Path:
    tok = tiny_tokenizer()
    tiny_llama(len(tok), seed=3).save_pretrained(tmp / "init")
    tok.save_pretrained(tmp / "init")
    rows = [{"id": f"p{i}", "question": f"What is {i} + {i}?", "answers": [str(2 * i)], "type": "calculator",
             "source": "calculator", "split": "train"} for i in range(7)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["train"] |= {"init_model": str(tmp / "init"), "train_file": str(tmp / "train.jsonl"), "steps": 2,
                        "prompts_per_step": 3, "micro_batch_size": 2, "gradient_checkpointing": False,
                        "checkpoint_dir": str(tmp / "run"), "output_dir": str(tmp / "policy"), "lr": 1e-3,
                        "algorithm": {"kind": "grpo", "dynamic_sampling": False}}
    params["rollout"] |= {"group_size": 2, "max_policy_tokens": 6, "max_total_tokens": 256}
    params["distributed"] |= {"enabled": True, "zero_stage": 3, "dist_backend": "gloo"}
    params["run"] |= {"torch_threads": 1}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, repo_root: Path) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("dp_trainer")
    params = write_run(tmp, repo_root)
    env = dict(os.environ) | {"PYTHONPATH": str(repo_root),
                              "TORCH_EXTENSIONS_DIR": str(repo_root / ".cache" / "torch_extensions")}
    codes = launch([sys.executable, "-m", "tests.distributed.trainer_worker", str(params), str(tmp)], 2, env=env,
                   threads=1, timeout_s=600)
    assert codes == [0, 0], f"rank exit codes {codes}"
    return torch.load(tmp / "trainer.pt", weights_only=False), tmp


@pytest.mark.slow
def test_rollouts_sharded_and_gathered_whole(trained) -> None:
    r, _ = trained
    for step in ("first", "second", "third"):
        assert r[step]["kept_same_on_all_ranks"]  # every rank saw every group, in the same order
        assert r[step]["n_kept"] == 3 and r[step]["trajectories"] == 6.0  # 3 problems x 2 samples, over 2 ranks
        assert r[step]["rollout_matches_policy"]  # the ZeRO-3 rollout copy follows each optimiser step
        assert r[step]["metrics"]["train/skipped"] == 0.0


@pytest.mark.slow
def test_steps_update_and_resume_exactly(trained) -> None:
    r, _ = trained
    assert not torch.equal(r["before_second"], r["after"])
    assert (r["resumed_state"].step, r["resumed_state"].data_cursor) == (1, 3)
    assert torch.equal(r["resumed_after"], r["after"])  # same rollouts, same update after resume
    assert r["third"]["kept"] == r["second"]["kept"]  # the resumed run samples the same trajectories
    assert r["third"]["metrics"] == r["second"]["metrics"]


@pytest.mark.slow
def test_final_model_is_a_hugging_face_directory(trained) -> None:
    r, tmp = trained
    model = AutoModelForCausalLM.from_pretrained(tmp / "policy", dtype=torch.float32)
    assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), r["after"])
