"""Scratch workspaces for the orchestration tests: a snapshot of the code, a tiny model, tiny params."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml

from pipeline.jsonl import write_problems
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama, tiny_tokenizer

TINY_EVAL = {
    "run": {"experiment": "orchestration-test", "tracking_uri": "sqlite:///mlruns.db", "torch_threads": 1},
    "rollout": {"group_size": 2, "max_policy_tokens": 8, "max_total_tokens": 1024, "max_batch_sequences": 4},
    "evaluate": {"model": "tiny-model", "split_file": "data/test.jsonl", "limit": 2, "mode": "no_tools",
                 "plots": False, "resume": False, "compare_dirs": []},
}


def merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        base[key] = merge(base.get(key, {}), value) if isinstance(value, dict) else value
    return base


def make_workspace(ws: Path, repo_root: Path, overrides: dict) -> Path:
    """Copy the code (runs import these copies), write params.yaml, a tiny model and two test problems."""
    for name in ("pipeline", "flows", "sandbox"):
        shutil.copytree(repo_root / name, ws / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("dvc.yaml", "prefect.toml", ".dvcignore"):
        shutil.copy(repo_root / name, ws / name)
    params = merge(yaml.safe_load((repo_root / "params.yaml").read_text()), overrides)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    tok = tiny_tokenizer()
    tiny_llama(len(tok), seed=0).save_pretrained(ws / "tiny-model")
    tok.save_pretrained(ws / "tiny-model")
    write_problems(ws / "data/test.jsonl", [
        Problem(f"t{i}", f"What is {i} + {i}?", (str(2 * i),), "calculator", "calculator", "test") for i in (2, 3)])
    return ws


def subprocess_env(api_url: str, home: Path) -> dict[str, str]:
    """Environment for Prefect/DVC subprocesses: this venv first, our server, no analytics."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PREFECT_API_URL": api_url, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "1", "TOKENIZERS_PARALLELISM": "false"}
