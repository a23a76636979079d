"""Seeded, resumable streams of training problems.

Each epoch is a fresh permutation drawn from (seed, epoch); a stream's whole state is one
integer cursor, saved in checkpoints, so a resumed run draws exactly the same problems.

`SourceBalancedStream` departs from the uniform draw of GRPO/DAPO recipes on purpose: with a
few prompts per step and dynamic sampling, a mix whose sources differ in difficulty trains
almost only on the easier source (its groups are the ones that survive), so the other
source's tool choice is never reinforced. Cycling through the sources keeps every step mixed.
"""

from __future__ import annotations

import numpy as np

from pipeline.types import Problem


class ProblemStream:
    """Uniform: each epoch a permutation of all problems."""

    def __init__(self, problems: list[Problem], seed: int, cursor: int = 0) -> None:
        if not problems:
            raise ValueError("no training problems")
        self.problems, self.seed, self.cursor = problems, seed, cursor
        self._orders: dict[tuple[int, ...], np.ndarray] = {}

    def _permutation(self, key: tuple[int, ...], n: int) -> np.ndarray:
        if key not in self._orders:
            self._orders[key] = np.random.default_rng([self.seed, *key]).permutation(n)
        return self._orders[key]

    def _problem_at(self, cursor: int) -> Problem:
        epoch, index = divmod(cursor, len(self.problems))
        return self.problems[int(self._permutation((epoch,), len(self.problems))[index])]

    def take(self, n: int) -> list[Problem]:
        out = [self._problem_at(self.cursor + i) for i in range(n)]
        self.cursor += n
        return out


class SourceBalancedStream(ProblemStream):
    """Round-robin over sources (sorted by name); each source walks its own seeded epochs, so a
    small source repeats sooner than a large one and the cursor alone still fixes the state."""

    def __init__(self, problems: list[Problem], seed: int, cursor: int = 0) -> None:
        super().__init__(problems, seed, cursor)
        names = sorted({p.source for p in problems})
        self.by_source = [[p for p in problems if p.source == name] for name in names]

    def _problem_at(self, cursor: int) -> Problem:
        turn, source = divmod(cursor, len(self.by_source))
        pool = self.by_source[source]
        epoch, index = divmod(turn, len(pool))
        return pool[int(self._permutation((source, epoch), len(pool))[index])]


def problem_stream(problems: list[Problem], seed: int, cursor: int, balance_sources: bool) -> ProblemStream:
    """The configured stream (chosen once at set-up)."""
    return (SourceBalancedStream if balance_sources else ProblemStream)(problems, seed, cursor)
