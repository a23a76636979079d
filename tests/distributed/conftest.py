"""One 2-rank launch (DeepSpeed on gloo) shared by the distributed tests: start-up is most of its cost."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from pipeline.distributed.launch import on_this_machine, run_ranks
from tests.helpers.recipe import plain_params
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


def write_run(tmp: Path, repo_root: Path) -> Path:
    """A tiny model, 7 calculator problems and a params file with `distributed.enabled` (ZeRO-3)."""
    tok = tiny_tokenizer()
    tiny_llama(len(tok), seed=3).save_pretrained(tmp / "init")
    tok.save_pretrained(tmp / "init")
    rows = [{"id": f"p{i}", "question": f"What is {i} + {i}?", "answers": [str(2 * i)], "type": "calculator",
             "source": "calculator", "split": "train"} for i in range(7)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    params = plain_params(yaml.safe_load((repo_root / "params.yaml").read_text()))
    params["train"] |= {"init_model": str(tmp / "init"), "train_file": str(tmp / "train.jsonl"), "steps": 2,
                        "output_dir": str(tmp / "policy")}
    params["train"]["sampling"]["prompts_per_step"] = 3
    params["train"]["update"] |= {"micro_batch_size": 2, "gradient_checkpointing": False,
                                  "ppo_mini_batches": 2}  # 2 groups then 1: the second leaves one rank idle
    params["train"]["checkpoints"]["dir"] = str(tmp / "run")
    params["train"]["optimizer"]["lr"] = 1e-3
    params["train"] |= {
                        "algorithm": {"kind": "grpo", "eps": 0.2, "std_normalize": True, "dynamic_sampling": False,
                                      "filter_metric": "accuracy",
                                      "kl_coef": 0.0}}
    params["rollout"] |= {"group_size": 2, "max_policy_tokens": 6, "max_total_tokens": 384}  # the prompt fits
    params["distributed"] |= {"enabled": True, "zero_stage": 3, "collectives": "gloo"}
    params["run"] |= {"torch_threads": 1}
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory, repo_root: Path) -> Path:
    """Run `tests.distributed.worker` on 2 ranks; returns the directory holding result.pt and trainer.pt."""
    out = tmp_path_factory.mktemp("two_ranks")
    params = write_run(out, repo_root)
    env = dict(os.environ) | {"PYTHONPATH": str(repo_root),
                              "TORCH_EXTENSIONS_DIR": str(repo_root / ".cache" / "torch_extensions")}
    result = run_ranks(["-m", "tests.distributed.worker", str(out), str(params)], on_this_machine(2),
                       log_dir=out / "rank_logs", env=env | {"OMP_NUM_THREADS": "1"}, timeout_s=900)
    assert result.returncode == 0, f"ranks failed (launcher exit {result.returncode}):\n{result.tail}"
    return out
