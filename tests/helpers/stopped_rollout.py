"""The tests that stop a rollout while a tool call is pending (`tests/rollout/test_stopped_rollout.py` on the hf
backend, `tests/vllm/test_vllm_stopped_rollout.py` on vLLM): the tool that never answers and the script's way of
stopping, run in the child process, and the test's side, which watches that process end."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.faults.conftest import Stage, assert_all_gone, stage_env

STOPS = ("sigterm", "cancel")  # a SIGTERM inside a stage; the awaiting caller cancelling the rollout


class Unanswered:
    """A code tool that never answers: prints "called" (the test's cue to stop the process) and runs `on_call`."""

    name = "code"
    on_call = staticmethod(lambda: None)

    async def __call__(self, code: str) -> None:
        print("called", flush=True)
        self.on_call()
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        pass


def stop_mid_rollout(engine, problems: list, n: int, stop: str) -> None:
    """In the child: roll out `problems` on `engine` (whose code tool is `Unanswered`, the engine never closed, as by
    a crash) inside a stage for "sigterm" (the test sends it), or cancel the rollout at the first call."""
    from flows.common import stage_process

    if stop == "sigterm":
        with stage_process():
            engine.rollout(problems, n)
        return

    async def cancelled_at_the_first_call() -> None:
        task = asyncio.current_task()
        Unanswered.on_call = staticmethod(lambda: task.cancel())
        await engine.arollout(problems, n)

    try:
        asyncio.run(cancelled_at_the_first_call())  # closing the loop joins the threads it started
    except asyncio.CancelledError:
        print("cancelled", flush=True)


def assert_a_stopped_rollout_ends(command: list[str], cwd: Path, stop: str) -> None:
    """Run `command` (a script ending in `stop_mid_rollout`), stop it at the first tool call, and check that it exits
    as stopped (143 on SIGTERM, 0 once cancelled) and leaves none of the processes it had started running."""
    stage = Stage(command, cwd, stage_env())
    try:
        stage.wait_for_line("called")
        started = psutil.Process(stage.proc.pid).children(recursive=True)
        if stop == "sigterm":
            stage.proc.send_signal(signal.SIGTERM)
        try:
            code = stage.wait()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process stopped mid-rollout ({stop}) did not exit:\n{stage.output()[-3000:]}")
        assert code == (143 if stop == "sigterm" else 0), stage.output()[-3000:]
        assert stop == "sigterm" or "cancelled" in stage.output()
        assert_all_gone(started, f"the processes of a rollout stopped by {stop}")
    finally:
        stage.kill_all()
