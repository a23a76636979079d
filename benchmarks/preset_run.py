"""The files of a workspace where the learning-cpu preset ran, for the benchmarks that start from its cold start.

`python -m flows.experiment configs/experiments/learning-cpu.yaml --seeds 0` runs the preset as the DVC experiment
learning-cpu-s0, and `dvc exp apply learning-cpu-s0` puts its params and outputs in the workspace: the SFT model
(`sft.output_dir`), the curated training mix (`train.train_file`) and the held-out problems (`evaluate.split_file`),
at the paths the preset's params name under the workspace root. `preset_config` configures a benchmark's run from
the preset with those files, writing its own checkpoints and tracking under a work dir.

A benchmark's quick mode (`benchmarks.harness`) runs in a workspace made here (`quick_workspace`): the preset at
quick sizes, the toy problems of tests/train/toy_task.py as training mix and held-out set, and a tiny model
cold-started in a second to answer them right or wrong in equal shares, so every stage downstream (dynamic
sampling's filter included) has something to do.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import yaml

from benchmarks.harness import WORKSPACE_ENV, params_file
from pipeline.config import RunConfig, load_config, read_params
from pipeline.config.params_file import merge
from pipeline.jsonl import write_problems
from pipeline.paths import REPO_ROOT
from pipeline.protocols import TapoProtocol
from pipeline.rollout.engine import encode_prompt
from pipeline.sft import Trace, sft_step, to_batch
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama
from tests.train.toy_task import DIRECT, QUESTION, toy_tokenizer

PRESET = Path("configs/experiments/learning-cpu.yaml")
RUN_IT = f"python -m flows.experiment {PRESET} --seeds 0, then dvc exp apply learning-cpu-s0"
# The learning-cpu preset at quick sizes: groups of 4 (the coin-flip model keeps about 7 in 8 of them under DAPO's
# accuracy filter), short responses, few rows.
QUICK_PRESET = {"rollout": {"group_size": 4, "max_policy_tokens": 24, "max_batch_sequences": 8},
                "reward": {"overlong_buffer": 8}, "train": {"sampling": {"prompts_per_step": 2}, "update": {"micro_batch_size": 4}},
                "evaluate": {"limit": 4}}


@dataclasses.dataclass(frozen=True)
class PresetRun:
    root: Path
    preset: Path  # the workspace's preset file (it extends the workspace's params.yaml)
    sft: Path  # the SFT model dir
    train: Path  # the training mix (jsonl)
    test: Path  # the held-out problems (jsonl)


def preset_run(root: str | Path = REPO_ROOT) -> PresetRun:
    """The workspace's preset files; FileNotFoundError naming the first one missing and how to make it."""
    root = Path(root).resolve()
    preset = root / PRESET
    if not preset.is_file():
        raise FileNotFoundError(f"{preset} is missing: {root} is not a checkout of this project")
    cfg = load_config(preset)
    run = PresetRun(root, preset, sft=root / cfg.sft.output_dir, train=root / cfg.train.train_file,
                    test=root / cfg.evaluate.split_file)
    for path in (run.sft / "config.json", run.train, run.test):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {root} is not a workspace where the learning-cpu preset "
                                    f"ran (run it there: {RUN_IT})")
    return run


def preset_run_or_exit(root: str | Path = REPO_ROOT) -> PresetRun:
    try:
        return preset_run(root)
    except FileNotFoundError as err:
        sys.exit(str(err))


def preset_config(root: str | Path, work_dir: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The preset's config on the workspace's files: RL from its SFT model on its training mix, evaluation on its
    held-out problems; tracking, checkpoints, the trained policy and evaluation output under `work_dir`;
    `overrides` (dotted keys) last."""
    run, work = preset_run(root), Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    return load_config(run.preset, overrides={
        "run.tracking_uri": f"sqlite:///{work / 'mlruns.db'}",
        "train.init_model": str(run.sft), "train.train_file": str(run.train),
        "train.checkpoints.dir": str(work / "rl"), "train.output_dir": str(work / "policy"),
        "evaluate.split_file": str(run.test), "evaluate.output_dir": str(work / "eval"),
        **(overrides or {})})


@contextmanager
def workspace(run: Path | None, quick: bool) -> Iterator[Path]:
    """The workspace a benchmark reads a preset run from: `run` if given; in quick mode the shared quick workspace,
    or one made for this run in a temporary folder; else this checkout."""
    if run is not None or not quick:
        yield (run or REPO_ROOT).resolve()
    elif os.environ.get(WORKSPACE_ENV):
        yield Path(os.environ[WORKSPACE_ENV])
    else:
        with tempfile.TemporaryDirectory(prefix="bench-quick-") as tmp:
            yield quick_workspace(Path(tmp))


def policy_dir(root: Path) -> Path:
    """The SFT policy the workspace `root` holds if the pipeline wrote one, else its base model."""
    found = next((d for d in (root / "models/sft", root / "models/base") if (d / "config.json").is_file()), None)
    if found is None:
        raise SystemExit(f"no model in {root}: run `python -m flows.prepare_model` first (writes models/base)")
    return found


def quick_workspace(root: Path, overrides: Mapping[str, Any] | None = None) -> Path:
    """A workspace in `root` laid out as after a learning-cpu preset run (`benchmarks.preset_run`): params.yaml
    extending this checkout's with the dotted `overrides` (the URLs of services already running: `sandbox.url`,
    `search.url`, `search.redis_url`), the preset at quick sizes, the toy problems as training mix and held-out
    set, and the toy coin-flip model as its SFT model."""
    root = root.resolve()
    (root / PRESET).parent.mkdir(parents=True, exist_ok=True)
    params_file(root / "params.yaml", overrides or {})
    preset = merge(read_params((REPO_ROOT / PRESET).read_text(encoding="utf-8")), QUICK_PRESET)
    (root / PRESET).write_text(yaml.safe_dump(preset, sort_keys=False))
    cfg = load_config(root / PRESET)
    write_problems(root / cfg.train.train_file, toy_problems(8, "train"))
    write_problems(root / cfg.evaluate.split_file, toy_problems(4, "test"))
    coin_flip_model(root / cfg.sft.output_dir)
    return root


def toy_problems(n: int, split: str) -> list[Problem]:
    """The toy task's question (tests/train/toy_task.py), a calculator problem: its prompt offers the code tool."""
    return [Problem(f"toy-{split}-{i}", QUESTION, ("42",), "calculator", "calculator", split) for i in range(n)]


def coin_flip_model(out_dir: Path, sft_steps: int = 40) -> Path:
    """A tiny Llama cold-started (seeded) to answer the toy question's tool prompt directly, right (42) or wrong
    (13) in equal shares, so a group's answers differ and dynamic sampling keeps most groups; saved with its
    tokenizer to `out_dir`."""
    tokenizer = toy_tokenizer()
    problem = toy_problems(1, "train")[0]
    prompt = encode_prompt(tokenizer, TapoProtocol(), problem, ("code",))
    traces = []
    for answer in ("42", "13"):
        ids = tokenizer(DIRECT.format(answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        traces.append(Trace(answer, tuple(prompt + ids), tuple([0] * len(prompt) + [1] * len(ids))))
    model = tiny_llama(len(tokenizer), seed=0)
    batch = to_batch(traces, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only spin (20x the CPU on a loaded machine)
    try:
        for _ in range(sft_steps):
            sft_step(model, optimizer, batch, micro_size=2)
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
