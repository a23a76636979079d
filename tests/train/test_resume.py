"""`--resume` continues exactly: a training run killed with SIGKILL mid-run and resumed logs the
same per-step metrics as an uninterrupted run (CPU, the toy tool task; with the real code sandbox, and
without tools under dynamic sampling by refill).

The runs go through `pipeline.train.run` in a child process (the flow adds only Prefect's
start-up around it); the child is killed after it has logged a step past a checkpoint, so
the resumed run must restore the model, optimiser, scheduler, RNG states, data cursor and
rollout seed to reproduce that step and the ones after it.

Every metric must match bit for bit, and the final weights too, with the sandbox and with
dynamic sampling by refill as without tools: a sequence re-enters the decoding batch at a step
fixed when it called its tool (a replacement group when the dropped one closed), not when the
tool answers, so its neighbours there, and the rounding of its log-probs, do not depend on
tool latency (pipeline.rollout.schedule._ClockedRun; tests/rollout/test_tool_timing.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pipeline.config import load_config
from pipeline.training_run.checkpoint import latest_checkpoint
from pipeline.training_run.folder import run_folder
from pipeline.model import load_policy
from pipeline.paths import REPO_ROOT
from pipeline.rollout.engine import RolloutEngine
from pipeline.tools.code import CodeSandboxClient
from tests.train.test_learning import read_history
from tests.train.toy_task import build_toy_model, toy_config, toy_problems, write_params

STEPS, CHECKPOINT_EVERY, KILL_AFTER_LOGGED = 6, 2, 3  # killed after step 2 is logged: resumes from step 2
# Wall-clock figures differ between any two runs, and so do the decoder's prefill and decoding-step counts:
# rows that come back from a tool together share one prefill and the same steps, and which rows do depends
# on tool latency. Everything else must match exactly.
TIMING = re.compile(r"(wall_s|_s/|seconds|per_s|idle_fraction|latency|prefill_tokens|reused_kv_tokens|decode_step)")
DRIVER = (  # as the stage runs it: planned (`--resume` insists), then trained
    "import sys; from pathlib import Path; from pipeline.config import load_config; from pipeline.train import run; "
    "from pipeline.training_run.plan import plan_run; cfg, metrics = load_config(sys.argv[1]), Path(sys.argv[4]); "
    "plan = plan_run(cfg, metrics_dir=metrics, mode='insisted' if sys.argv[3] == 'resume' else 'never'); "
    "run(cfg, {'code': sys.argv[2]} if sys.argv[2] else {}, plan, metrics_dir=metrics)"
)


def start_training(params: Path, sandbox_url: str, mode: str, metrics_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(params), sandbox_url, mode, str(metrics_dir)],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout_s: float = 300) -> None:
    _, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, err[-3000:]


def logged_steps(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def kill_after_logged(proc: subprocess.Popen, history: Path, n_logged: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while logged_steps(history) < n_logged:
        if proc.poll() is not None:
            pytest.fail(f"training ended before it was killed: {proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, "training made no progress"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def comparable(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if not TIMING.search(k)}


def assert_same_metrics(row: dict[str, float], expected: dict[str, float], *, exact: bool) -> None:
    got, want = comparable(row), comparable(expected)
    assert sorted(got) == sorted(want), f"step {row['step']}: metric names differ"
    for key, value in want.items():
        if exact or not key.startswith("train/"):
            assert got[key] == value, f"step {row['step']} {key}: {got[key]} != {value} after resume"
        else:
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), f"step {row['step']} {key}"


# refill: dynamic sampling replaces dropped groups inside the running rollout (groups of 2 agree half the
# time); a replacement joins the batch when the event loop has scored the dropped group, so its neighbours,
# like a tool's, depend on timing.
REFILL = {"group_size": 2, "prompts_per_step": 2, "max_gen_rounds": 3, "refill_dropped_groups": True}


@pytest.mark.slow
# Without tools and without refill, tests/faults/test_resume.py kills the same runs at four points and checks the
# same bit-for-bit equality; here the two paths whose timing could leak into the samples.
@pytest.mark.parametrize(("with_tool", "sampling"), [(True, {}), (False, REFILL)], ids=["code-sandbox", "no-tools-refill"])
def test_killed_and_resumed_run_logs_the_same_metrics(tmp_path: Path, code_sandbox_url: str, with_tool: bool,
                                                      sampling: dict) -> None:
    tool_url = code_sandbox_url if with_tool else ""
    model_dir = build_toy_model(tmp_path / "model", code_sandbox_url)
    runs = {}
    for name in ("straight", "killed"):
        root = tmp_path / name
        root.mkdir()
        params = write_params(toy_config(root, model_dir, steps=STEPS, checkpoints__every=CHECKPOINT_EVERY, lr=1e-3,
                                         **sampling), root / "params.yaml")
        runs[name] = (root, params)

    root, params = runs["straight"]
    finish(start_training(params, tool_url, "fresh", root / "metrics"))

    root, params = runs["killed"]
    history = root / "metrics" / "train_history.jsonl"
    kill_after_logged(start_training(params, tool_url, "fresh", root / "metrics"), history, KILL_AFTER_LOGGED)
    checkpoint = latest_checkpoint(run_folder(load_config(params)))
    logged_before_kill = logged_steps(history)
    assert checkpoint is not None
    resume_from = int(checkpoint.name.removeprefix("step-"))
    assert resume_from < logged_before_kill < STEPS  # killed mid-run, after a step the checkpoint lacks
    assert not (root / "policy").exists()
    finish(start_training(params, tool_url, "resume", root / "metrics"))

    straight = read_history(runs["straight"][0] / "metrics" / "train_history.jsonl")
    rows = [json.loads(line) for line in history.read_text().splitlines()]
    # The steps after the checkpoint ran twice; the history holds each step once, as the resumed run logged it
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    assert sorted(straight) == list(range(STEPS))
    assert any(straight[s]["train/skipped"] == 0.0 for s in range(2, STEPS))  # the resumed steps really train
    if with_tool:  # the tool path really runs: calls, outputs fed back, then answers
        assert all(straight[s]["rollout/calls_per_traj/code"] > 0.5 for s in range(STEPS))
    if sampling:  # some step replaced a dropped group
        assert any(straight[s]["train/problems_drawn"] > sampling["prompts_per_step"] for s in range(STEPS))
    exact = True  # with tools and refills too: rows rejoin the batch on the decoding clock
    for row in rows:
        assert_same_metrics(row, straight[int(row["step"])], exact=exact)
    resumed = load_file(root / "policy" / "model.safetensors")
    uninterrupted = load_file(runs["straight"][0] / "policy" / "model.safetensors")
    assert sorted(resumed) == sorted(uninterrupted)
    for name, weight in uninterrupted.items():
        if not exact:  # see the module docstring: log-prob rounding reaches the gradients
            assert torch.allclose(resumed[name], weight, rtol=0, atol=1e-5), name
        else:
            assert torch.equal(resumed[name], weight), name


class SlowFirstCall:
    """The real sandbox client, with the first call answered `delay_s` late (a slow network)."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s, self.calls = inner, delay_s, 0

    async def __call__(self, call_input: str):
        self.calls += 1
        if self.calls == 1:
            await asyncio.sleep(self.delay_s)
        return await self.inner(call_input)

    async def aclose(self) -> None:
        await self.inner.aclose()


def sample_with_tool_delay(model_dir: Path, sandbox_url: str, delay_s: float, root: Path) -> list:
    cfg = toy_config(root, model_dir, steps=1)
    model, tokenizer = load_policy(model_dir)
    torch.manual_seed(0)
    tool = SlowFirstCall(CodeSandboxClient(sandbox_url), delay_s)
    with RolloutEngine(model, tokenizer, {"code": tool}, cfg.rollout, seed=0) as engine:
        groups = engine.rollout(toy_problems(2), cfg.rollout.group_size).groups
    return [(t.response_ids, t.logprobs) for g in groups for t in g.trajectories]


def test_samples_do_not_depend_on_tool_latency(tmp_path: Path, code_sandbox_url: str) -> None:
    """Resume equality with tools needs this: the same seed gives the same trajectories however fast tools answer."""
    model_dir = build_toy_model(tmp_path / "model", code_sandbox_url)
    fast = sample_with_tool_delay(model_dir, code_sandbox_url, 0.0, tmp_path / "fast")
    slow = sample_with_tool_delay(model_dir, code_sandbox_url, 0.5, tmp_path / "slow")
    assert [ids for ids, _ in fast] == [ids for ids, _ in slow]  # every row draws from its own generator
    # Log-probs agree exactly: rows rejoin the batch at steps the tokens fix, whatever the tool's latency.
    assert [lp for _, lp in fast] == [lp for _, lp in slow]
