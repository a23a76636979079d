"""A rollout stopped while a tool has not answered ends its decoder thread: a process stopped mid-rollout (SIGTERM
inside a stage) exits, and a cancelled rollout (an awaiting caller's timeout) lets its event loop close.

Found stopping the train stage with SIGTERM mid-step: it printed "stage stopped by SIGTERM" and then never exited.
The decoder thread waited for a tool answer due at its step, which the stopped event loop would never deliver,
and the interpreter's exit waited for the thread. Each scheduler waits for tools its own way (at a step on the
decoder's clock, on arrival, at the end of a turn), so each is stopped both ways, with a tool that never answers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.faults.conftest import Stage, stage_env

ROLLOUT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from flows.common import stage_process
    from pipeline.model import load_policy
    from pipeline.rollout.engine import RolloutEngine
    from tests.train.toy_task import toy_config, toy_problems
    from tests.helpers.unanswered import Unanswered

    model_dir, root, schedule, readmit, stop = sys.argv[1:]

    cfg = toy_config(Path(root), Path(model_dir), steps=1).rollout.model_copy(
        update={"schedule": schedule, "readmit_after_steps": int(readmit), "max_batch_sequences": 4})
    model, tokenizer = load_policy(model_dir)
    engine = RolloutEngine(model, tokenizer, {"code": Unanswered()}, cfg, seed=0)  # never closed, as by a crash
    if stop == "sigterm":
        with stage_process():
            engine.rollout(toy_problems(2), cfg.group_size)
    else:
        async def cancelled_at_the_first_call():
            task = asyncio.current_task()
            Unanswered.on_call = staticmethod(lambda: task.cancel())
            await engine.arollout(toy_problems(2), cfg.group_size)
        try:
            asyncio.run(cancelled_at_the_first_call())  # closing the loop joins the threads it started
        except asyncio.CancelledError:
            print("cancelled", flush=True)
""")
SCHEDULES = {"clocked": ("continuous", 8), "on-arrival": ("continuous", 0), "turn-synchronous": ("turn-synchronous", 0)}


@pytest.mark.parametrize("stop", ["sigterm", "cancel"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_a_rollout_stopped_while_a_tool_has_not_answered_ends(toy_model: Path, tmp_path: Path, schedule: str,
                                                               stop: str) -> None:
    stage = Stage([sys.executable, "-c", ROLLOUT, str(toy_model), str(tmp_path), *map(str, SCHEDULES[schedule]), stop],
                  tmp_path, stage_env())
    try:
        stage.wait_for_line("called")
        if stop == "sigterm":
            stage.proc.send_signal(signal.SIGTERM)
        try:
            code = stage.wait()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process stopped mid-rollout ({stop}) did not exit:\n{stage.output()[-3000:]}")
        assert code == (143 if stop == "sigterm" else 0), stage.output()[-3000:]
        assert stop == "sigterm" or "cancelled" in stage.output()
    finally:
        stage.kill_all()
