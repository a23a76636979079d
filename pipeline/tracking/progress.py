"""Progress of long loops (SFT steps, evaluation samples) where a person can see it.

On a terminal, a tqdm bar. Elsewhere (a log file, a flow's worker) a bar cannot redraw and
tqdm stays silent (`disable=None`), so a long stage would print nothing for minutes: there,
one plain line at most every `every_s` seconds and one at the end,
`sft 12/40 steps | 5.2 s/step | ETA 2 min | loss 0.412`. The pace is that since the previous line,
so work that completes at once (evaluation samples resumed from disk) does not flatter the ETA for long.

A line shows the values of the step it counts, whichever order the caller reports them in: tqdm's loops call
`set_postfix` before or after `update`, and a line printed at `update` would carry the previous step's values
in the second order (the SFT loop's "8/8 | loss 0.149" when the last step's loss was 0.065). So where a caller
sets values after its `update` (the order its first `set_postfix` shows), a line falling due at `update` waits
for them: it is printed by the `set_postfix` that follows or, if the next call is not one, before that call
(`close` included). The last line waits too until the order is known, since `close` follows it at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

LINE_EVERY_S = 30.0


def pace_and_eta(seconds_per_unit: float, units_left: int, unit: str) -> list[str]:
    """`["85.1 s/step", "ETA 52 min"]`: the tail of every progress line (these, and training's per-step line)."""
    return [f"{seconds_per_unit:.1f} s/{unit}", f"ETA {seconds_per_unit * max(units_left, 0) / 60:.0f} min"]


class LineProgress:
    """The slice of tqdm's interface the stages use (`update`, `set_postfix`, `close`, a context), as lines."""

    def __init__(self, total: int, desc: str, unit: str, every_s: float = LINE_EVERY_S,
                 out: TextIO | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.out, self.clock = out, clock
        self.done, self.postfix = 0, ""
        self.mark_time, self.mark_done = clock(), 0  # when the last line was printed, and `done` then
        self.values_follow: bool | None = None  # values set after their step's `update`; None: none set yet
        self.due: float | None = None  # when a line fell due that waits for this step's values

    def update(self, n: int = 1) -> None:
        self._flush()  # a line that waited for values that never came: the values are what they are
        self.done += n
        now = self.clock()
        if now - self.mark_time >= self.every_s or self.done >= self.total:
            if self.values_follow or (self.values_follow is None and self.done >= self.total):
                self.due = now  # this step's values come next
            else:
                self._print(now)

    def set_postfix(self, **values: object) -> None:
        if self.values_follow is None:
            self.values_follow = self.done > 0
        self.postfix = " | ".join(f"{k} {v}" for k, v in values.items())
        self._flush()

    def close(self) -> None:
        self._flush()
        if self.mark_done != self.done:
            self._print(self.clock())

    def _flush(self) -> None:
        if self.due is not None:
            self._print(self.due)

    def line(self, now: float) -> str:
        per_unit = (now - self.mark_time) / max(self.done - self.mark_done, 1)
        parts = [f"{self.desc} {self.done}/{self.total} {self.unit}s",
                 *pace_and_eta(per_unit, self.total - self.done, self.unit)]
        return " | ".join(parts + ([self.postfix] if self.postfix else []))

    def _print(self, now: float) -> None:
        print(self.line(now), file=self.out or sys.stderr, flush=True)
        self.mark_time, self.mark_done, self.due = now, self.done, None

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int, desc: str, unit: str) -> tqdm | LineProgress:
    """A tqdm bar where one can draw (a terminal), else a `LineProgress`."""
    bar = tqdm(total=total, desc=desc, unit=unit, disable=None)
    if not bar.disable:
        return bar
    bar.close()
    return LineProgress(total, desc, unit)
