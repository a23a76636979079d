"""Progress of long loops (SFT steps, evaluation samples) where a person can see it.

On a terminal, a tqdm bar. Elsewhere (a log file, a flow's worker) a bar cannot redraw and
tqdm stays silent (`disable=None`), so a long stage would print nothing for minutes: there,
one plain line at most every `every_s` seconds and one at the end,
`sft 12/40 steps | 5.2 s/step | ETA 2 min | loss 0.412`. The pace is that since the previous line,
so work that completes at once (evaluation samples resumed from disk) does not flatter the ETA for long.
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

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if now - self.mark_time >= self.every_s or self.done >= self.total:
            self._print(now)

    def set_postfix(self, **values: object) -> None:
        self.postfix = " | ".join(f"{k} {v}" for k, v in values.items())

    def close(self) -> None:
        if self.mark_done != self.done:
            self._print(self.clock())

    def line(self, now: float) -> str:
        per_unit = (now - self.mark_time) / max(self.done - self.mark_done, 1)
        parts = [f"{self.desc} {self.done}/{self.total} {self.unit}s",
                 *pace_and_eta(per_unit, self.total - self.done, self.unit)]
        return " | ".join(parts + ([self.postfix] if self.postfix else []))

    def _print(self, now: float) -> None:
        print(self.line(now), file=self.out or sys.stderr, flush=True)
        self.mark_time, self.mark_done = now, self.done

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
