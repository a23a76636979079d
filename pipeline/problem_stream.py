"""A seeded, resumable stream of training problems.

Each epoch is a fresh permutation drawn from (seed, epoch); the stream's whole state is one
integer cursor, saved in checkpoints, so a resumed run draws exactly the same problems.
"""

from __future__ import annotations

import numpy as np

from pipeline.types import Problem


class ProblemStream:
    def __init__(self, problems: list[Problem], seed: int, cursor: int = 0) -> None:
        if not problems:
            raise ValueError("no training problems")
        self.problems, self.seed, self.cursor = problems, seed, cursor
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))
        return self._orders[epoch]

    def take(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            epoch, index = divmod(self.cursor, len(self.problems))
            out.append(self.problems[int(self._order(epoch)[index])])
            self.cursor += 1
        return out
