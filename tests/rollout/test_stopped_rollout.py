"""A rollout stopped while a tool has not answered ends its decoder thread: a process stopped mid-rollout (SIGTERM
inside a stage) exits, and a cancelled rollout (an awaiting caller's timeout) lets its event loop close.

Found stopping the train stage with SIGTERM mid-step: it printed "stage stopped by SIGTERM" and then never exited.
The decoder thread waited for a tool answer due at its step, which the stopped event loop would never deliver,
and the interpreter's exit waited for the thread. Each scheduler waits for tools its own way (at a step on the
decoder's clock, on arrival, at the end of a turn), so each is stopped both ways, with a tool that never answers."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.stopped_rollout import STOPS, assert_a_stopped_rollout_ends

pytestmark = pytest.mark.integration  # rollouts stopped by signals, in child processes

ROLLOUT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pipeline.model import load_policy
    from pipeline.rollout.engine import RolloutEngine
    from tests.helpers.stopped_rollout import Unanswered, stop_mid_rollout
    from tests.train.toy_task import toy_config, toy_problems

    model_dir, root, schedule, readmit, stop = sys.argv[1:]
    cfg = toy_config(Path(root), Path(model_dir), steps=1).rollout.model_copy(
        update={"schedule": schedule, "readmit_after_steps": int(readmit), "max_batch_sequences": 4})
    model, tokenizer = load_policy(model_dir)
    engine = RolloutEngine(model, tokenizer, {"code": Unanswered()}, cfg, seed=0)
    stop_mid_rollout(engine, toy_problems(2), cfg.group_size, stop)
""")
SCHEDULES = {"clocked": ("continuous", 8), "on-arrival": ("continuous", 0), "turn-synchronous": ("turn-synchronous", 0)}


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_a_rollout_stopped_while_a_tool_has_not_answered_ends(toy_model: Path, tmp_path: Path, schedule: str,
                                                               stop: str) -> None:
    assert_a_stopped_rollout_ends([sys.executable, "-c", ROLLOUT, str(toy_model), str(tmp_path),
                                   *map(str, SCHEDULES[schedule]), stop], tmp_path, stop)
