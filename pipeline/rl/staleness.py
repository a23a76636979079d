"""Bounded staleness for asynchronous RL: which groups may start sampling, which may be trained, and what to log.

Versions. The trainer's version `v` is the number of optimiser steps it has taken; the weights the inference
servers hold after the push that follows step `v` are version `v`. A group is *admitted* (starts sampling) at
the trainer's version then, and is *trained* by the step that turns version `v` into `v + 1`, "at `v`". Its
staleness is `v_trained - v_admitted`. With partial rollouts a group's later tokens may be sampled by newer
weights than its first ones, never older, so no token of it is staler than the group (`token_staleness`).

Admission (AReaL's rule, `areal/infra/staleness_manager.py`). With `B` groups trained per step, `η` the
`max_staleness`, `C` the most groups sampling at once, a group may be admitted while

    capacity = min(C - running, (η + v + 1) * B - (trained + accepted + running)) > 0

where `trained` counts the groups trained so far, `accepted` those finished and waiting to be trained, `running`
those sampling. AReaL counts `accepted` over the whole run (trained ones included); we keep the trained ones
apart, so `trained + accepted` is AReaL's `accepted`. Each step trains exactly `B` groups (`trained = v * B`), so
the rule is: at most `(η + 1) * B` groups between admission and training at any time.

Departure from AReaL, and why: the admission rule alone bounds staleness only when groups finish in the order they
were admitted. A multi-turn rollout waiting on a slow tool call can finish after any number of younger groups, be
trained late and exceed `η` (AReaL's name for `η` is `max_head_offpolicyness`: a bound on the head of the
queue, not on every group). Here the bound is exact: a step takes the `B` oldest finished groups (`take_batch`) and
drops any group, finished or still sampling, whose staleness at that step would exceed `η` (`is_stale`), as
prime-rl cancels stale groups before each weight update and TRL drops them when they are consumed. A dropped group
gives its place back to admission (its problem may be drawn again); the trainer never waits for a group it cannot
train. With `η = 0` this is the synchronous loop: exactly `B` groups are admitted at each version, all of them
trained at that version (tests/inference/test_staleness.py checks both properties over random completion orders
and training schedules).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StalenessBudget:
    """`groups_per_step` B, `max_staleness` η, `max_concurrent` C (see the module)."""

    groups_per_step: int
    max_staleness: int
    max_concurrent: int

    def __post_init__(self) -> None:
        if self.groups_per_step < 1 or self.max_staleness < 0 or self.max_concurrent < 1:
            raise ValueError(f"bad staleness budget: {self}")


def capacity(budget: StalenessBudget, version: int, trained: int, accepted: int, running: int) -> int:
    """How many more groups may be admitted now (0 or less: none). AReaL's rule; see the module."""
    by_concurrency = budget.max_concurrent - running
    by_staleness = (budget.max_staleness + version + 1) * budget.groups_per_step - (trained + accepted + running)
    return min(by_concurrency, by_staleness)


def is_stale(admitted_version: int, trainer_version: int, max_staleness: int) -> bool:
    """Whether a group admitted at `admitted_version` may no longer be trained at `trainer_version`."""
    return trainer_version - admitted_version > max_staleness


@dataclass(frozen=True)
class Ticket:
    """One admitted group: its order of admission and the trainer's version then."""

    order: int
    version: int


@dataclass
class AdmissionControl:
    """The counts the rule reads, kept as groups move: admitted -> finished -> trained, or dropped on the way.

    Not thread-safe: the asynchronous loop calls it from one event loop."""

    budget: StalenessBudget
    version: int = 0
    trained: int = 0
    running: dict[int, Ticket] = field(default_factory=dict)
    finished: dict[int, Ticket] = field(default_factory=dict)
    dropped: int = 0  # groups given up as too stale (finished or running), over the run
    _next: int = 0

    def capacity(self) -> int:
        return capacity(self.budget, self.version, self.trained, len(self.finished), len(self.running))

    def admit(self) -> Ticket:
        """A ticket for a group that starts sampling now; refused (RuntimeError) when there is no capacity."""
        if self.capacity() <= 0:
            raise RuntimeError(f"no capacity to admit a group at version {self.version}: {self}")
        ticket = Ticket(self._next, self.version)
        self._next += 1
        self.running[ticket.order] = ticket
        return ticket

    def finish(self, ticket: Ticket) -> None:
        """The group finished sampling and waits to be trained."""
        self.finished[ticket.order] = self.running.pop(ticket.order)

    def reject(self, ticket: Ticket) -> None:
        """The group will not be trained for another reason (dynamic sampling dropped it, its rollout failed):
        its place goes back to admission."""
        if ticket.order in self.running:
            del self.running[ticket.order]
        else:
            del self.finished[ticket.order]

    def take_batch(self) -> list[Ticket] | None:
        """The `B` oldest finished groups that are not stale at the current version, or None while fewer are
        ready (the trainer waits). Stale finished groups are dropped on the way."""
        self._drop_stale(self.finished)
        ready = sorted(self.finished.values(), key=lambda t: (t.version, t.order))
        if len(ready) < self.budget.groups_per_step:
            return None
        batch = ready[:self.budget.groups_per_step]
        for ticket in batch:
            del self.finished[ticket.order]
        return batch

    def trained_step(self, batch: Sequence[Ticket]) -> list[Ticket]:
        """The step trained `batch`: the version moves on. Returns the running groups that became stale (the caller
        aborts their requests); they are dropped here."""
        if len(batch) != self.budget.groups_per_step:
            raise ValueError(f"a step trains exactly {self.budget.groups_per_step} groups, not {len(batch)}")
        self.trained += len(batch)
        self.version += 1
        self._drop_stale(self.finished)
        return self._drop_stale(self.running)

    def _drop_stale(self, groups: dict[int, Ticket]) -> list[Ticket]:
        stale = [t for t in groups.values() if is_stale(t.version, self.version, self.budget.max_staleness)]
        for ticket in stale:
            del groups[ticket.order]
        self.dropped += len(stale)
        return stale


@dataclass(frozen=True)
class StalenessMetrics:
    """What a step logs about the age of what it trained (trajectories with at least one sampled token)."""

    token_staleness_mean: float
    token_staleness_max: int
    versions_per_trajectory: float
    crossed_update_share: float

    def as_metrics(self, prefix: str = "async/") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


def staleness_metrics(trainer_version: int, token_versions: Iterable[Sequence[int]]) -> StalenessMetrics:
    """`token_versions`: per trained trajectory, the policy version that sampled each of its sampled tokens.

    Token staleness is `trainer_version - version` over every sampled token of the step; a trajectory crossed an
    update when more than one version sampled it."""
    total, count, worst, distinct, crossed, trajectories = 0, 0, 0, 0, 0, 0
    for versions in token_versions:
        if not versions:
            continue
        if max(versions) > trainer_version:
            raise ValueError(f"a token of version {max(versions)} is newer than the trainer's {trainer_version}")
        ages = [trainer_version - v for v in versions]
        total, count, worst = total + sum(ages), count + len(ages), max(worst, max(ages))
        kinds = len(set(versions))
        distinct, crossed, trajectories = distinct + kinds, crossed + (kinds > 1), trajectories + 1
    if trajectories == 0:
        return StalenessMetrics(0.0, 0, 0.0, 0.0)
    return StalenessMetrics(total / count, worst, distinct / trajectories, crossed / trajectories)
