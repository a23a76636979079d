"""A progress line shows the values of the step it counts, whichever order the loop reports them in.

tqdm's loops set their values (`set_postfix`) before or after `update`; the SFT loop does the second, and a line
printed at `update` then carried the previous step's loss ("8/8 | loss 0.149", final 0.065)."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tracking.progress import LineProgress


class StepClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_loop(durations: list[float], values_after: bool, every_s: float) -> list[str]:
    """A loop of len(durations) steps, step k's value `v<k>`, reported after or before its `update`."""
    out, clock = io.StringIO(), StepClock()
    with LineProgress(total=len(durations), desc="sft", unit="step", every_s=every_s, out=out, clock=clock) as bar:
        for k, seconds in enumerate(durations, start=1):
            clock.now += seconds
            if not values_after:
                bar.set_postfix(loss=f"v{k}")
            bar.update(1)
            if values_after:
                bar.set_postfix(loss=f"v{k}")
    return out.getvalue().splitlines()


@settings(max_examples=300, deadline=None)
@given(durations=st.lists(st.floats(0.0, 50.0), min_size=1, max_size=30), values_after=st.booleans(),
       every_s=st.sampled_from([0.0, 10.0, 30.0]))
def test_every_line_shows_the_values_of_the_step_it_counts(durations: list[float], values_after: bool,
                                                           every_s: float) -> None:
    lines = run_loop(durations, values_after, every_s)
    assert lines, "no line at all"
    for line in lines:  # a line before any value was reported shows none (the loop's first, values after)
        count = line.split(" | ")[0].split()[1].split("/")[0]
        assert line.endswith(f"loss v{count}") or (values_after and count == "1" and "loss" not in line), line
    assert lines[-1].startswith(f"sft {len(durations)}/{len(durations)} steps")  # the last step shows
    counts = [int(line.split()[1].split("/")[0]) for line in lines]
    assert counts == sorted(set(counts)), "a step shown twice or out of order"


def test_the_sft_loops_order_ends_on_the_last_steps_loss() -> None:
    """The issue's case: 8 steps, values after `update`; the last line is step 8's, with step 8's loss."""
    lines = run_loop([12.0] * 8, values_after=True, every_s=30.0)
    assert lines[-1] == "sft 8/8 steps | 12.0 s/step | ETA 0 min | loss v8"
    assert lines[0] == "sft 3/8 steps | 12.0 s/step | ETA 1 min | loss v3"


def test_a_loop_without_values_prints_when_due() -> None:
    """The evaluation's loop sets no values: its lines are not held back."""
    out, clock = io.StringIO(), StepClock()
    bar = LineProgress(total=10, desc="evaluate", unit="sample", every_s=30.0, out=out, clock=clock)
    clock.now = 31.0
    bar.update(4)
    assert out.getvalue() == "evaluate 4/10 samples | 7.8 s/sample | ETA 1 min\n"
    clock.now = 40.0
    bar.update(6)
    bar.close()
    assert out.getvalue().splitlines()[-1] == "evaluate 10/10 samples | 1.5 s/sample | ETA 0 min"
