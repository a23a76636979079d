"""Progress lines where no bar can draw: how often, what they say, the last one."""

from __future__ import annotations

import io

from pipeline.tracking.progress import LineProgress, progress


class StepClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_every_interval_and_one_at_the_end() -> None:
    out, clock = io.StringIO(), StepClock()
    with LineProgress(total=10, desc="sft", unit="step", every_s=30.0, out=out, clock=clock) as bar:
        for _ in range(10):
            clock.now += 12.0  # 12 s a step: a line at 36 s (3 steps), 72 s (6), 108 s (9), and the 10th at the end
            bar.update(1)
            bar.set_postfix(loss="0.412")
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["sft 3/10 steps", "sft 6/10 steps", "sft 9/10 steps",
                                                          "sft 10/10 steps"]
    assert lines[0] == "sft 3/10 steps | 12.0 s/step | ETA 1 min | loss 0.412"  # 7 steps x 12 s left
    assert lines[-1] == "sft 10/10 steps | 12.0 s/step | ETA 0 min | loss 0.412"


def test_close_prints_what_the_last_line_missed() -> None:
    out, clock = io.StringIO(), StepClock()
    bar = LineProgress(total=100, desc="evaluate", unit="sample", every_s=30.0, out=out, clock=clock)
    clock.now = 5.0
    bar.update(8)
    assert out.getvalue() == ""
    bar.close()  # stopped early (an error): the partial count still shows
    assert out.getvalue() == "evaluate 8/100 samples | 0.6 s/sample | ETA 1 min\n"
    bar.close()
    assert out.getvalue().count("\n") == 1


def test_the_pace_is_that_since_the_last_line() -> None:
    """Samples resumed from disk complete at once; the next line's pace is the real one again."""
    out, clock = io.StringIO(), StepClock()
    bar = LineProgress(total=100, desc="evaluate", unit="sample", every_s=30.0, out=out, clock=clock)
    clock.now = 30.0
    bar.update(60)  # 60 resumed + a few real, in the first 30 s
    for _ in range(4):
        clock.now += 10.0
        bar.update(1)
    assert out.getvalue().splitlines() == ["evaluate 60/100 samples | 0.5 s/sample | ETA 0 min",
                                           "evaluate 63/100 samples | 10.0 s/sample | ETA 6 min"]


def test_no_terminal_means_lines() -> None:
    assert isinstance(progress(5, "sft", "step"), LineProgress)  # pytest captures stderr: not a terminal


def test_the_terminal_train_bar_shows_reward_accuracy_and_tool_calls() -> None:
    from tqdm import tqdm

    from pipeline.tracking.history import StepProgress

    steps = StepProgress(0, 3, enabled=True)
    out = io.StringIO()
    steps.bar = tqdm(range(3), desc="train", unit="step", file=out, disable=False)  # as on a terminal
    for step in steps:
        steps.show(step, {"reward/mean": 0.25, "reward/accuracy": 0.5, "rollout/calls_per_traj/code": 0.75,
                          "rollout/calls_per_traj/search": 0.0, "train/lr": 1e-6})
    steps.bar.close()
    assert "reward 0.250 | accuracy 0.500 | code 0.75 search 0.00 calls/traj" in out.getvalue()
