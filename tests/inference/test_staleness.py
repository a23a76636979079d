"""Bounded staleness (pipeline.rl.staleness): over random completion orders and training schedules no group is trained
more than η versions after it was admitted, and η = 0 is the synchronous schedule."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.rl.staleness import AdmissionControl, StalenessBudget, Ticket, capacity, staleness_metrics

# An action of the simulated loop: admit up to n groups, finish the running group at an index (any order), train.
ACTIONS = st.one_of(st.tuples(st.just("admit"), st.integers(1, 6)),
                    st.tuples(st.just("finish"), st.integers(0, 50)),
                    st.tuples(st.just("train"), st.just(0)))


@dataclass
class Run:
    """What the simulated loop did: each trained group with the version it was trained at."""

    control: AdmissionControl
    trained: list[tuple[Ticket, int]] = field(default_factory=list)
    admitted_at: dict[int, int] = field(default_factory=dict)  # version -> groups admitted at it

    def step(self, action: tuple[str, int]) -> None:
        kind, n = action
        c = self.control
        if kind == "admit":
            for _ in range(max(0, min(n, c.capacity()))):
                ticket = c.admit()
                self.admitted_at[ticket.version] = self.admitted_at.get(ticket.version, 0) + 1
        elif kind == "finish" and c.running:
            c.finish(sorted(c.running.values(), key=lambda t: t.order)[n % len(c.running)])
        elif kind == "train":
            batch = c.take_batch()
            if batch is not None:
                self.trained += [(t, c.version) for t in batch]
                c.trained_step(batch)

    def check_invariants(self) -> None:
        c, b = self.control, self.control.budget
        in_system = len(c.finished) + len(c.running)
        assert c.trained + in_system <= (b.max_staleness + c.version + 1) * b.groups_per_step
        assert in_system <= (b.max_staleness + 1) * b.groups_per_step
        assert len(c.running) <= b.max_concurrent
        assert c.trained == c.version * b.groups_per_step


def simulate(budget: StalenessBudget, actions: list[tuple[str, int]]) -> Run:
    run = Run(AdmissionControl(budget))
    for action in actions:
        run.step(action)
        run.check_invariants()
    return run


@settings(max_examples=300, deadline=None)
@given(groups=st.integers(1, 4), eta=st.integers(0, 3), concurrent=st.integers(1, 12),
       actions=st.lists(ACTIONS, max_size=120))
def test_no_group_is_trained_staler_than_max_staleness(groups: int, eta: int, concurrent: int,
                                                        actions: list[tuple[str, int]]) -> None:
    run = simulate(StalenessBudget(groups, eta, concurrent), actions)
    for ticket, version in run.trained:
        assert 0 <= version - ticket.version <= eta, (ticket, version)


@settings(max_examples=300, deadline=None)
@given(groups=st.integers(1, 4), concurrent=st.integers(1, 12), actions=st.lists(ACTIONS, max_size=120))
def test_eta_zero_is_the_synchronous_schedule(groups: int, concurrent: int, actions: list[tuple[str, int]]) -> None:
    run = simulate(StalenessBudget(groups, 0, concurrent), actions)
    by_version: dict[int, list[Ticket]] = {}
    for ticket, version in run.trained:
        by_version.setdefault(version, []).append(ticket)
    assert sorted(by_version) == list(range(run.control.version))
    for version, tickets in by_version.items():
        assert len(tickets) == groups and all(t.version == version for t in tickets)
    assert all(n <= groups for n in run.admitted_at.values())  # never more sampled than one step trains
    assert run.control.dropped == 0  # nothing is ever wasted


def test_a_slow_group_is_dropped_not_trained_late() -> None:
    # η = 1, B = 1: g0 and g1 admitted at v0; g0 waits on a slow tool while younger groups are trained.
    c = AdmissionControl(StalenessBudget(1, 1, 8))
    g0, g1 = c.admit(), c.admit()
    c.finish(g1)
    assert c.trained_step(c.take_batch()) == []  # trained g1 at v0; g0 (admitted v0) may still be trained at v1
    g2 = c.admit()
    c.finish(g2)
    assert c.trained_step(c.take_batch()) == [g0]  # v2 - v0 > 1: the caller aborts g0's requests
    assert c.dropped == 1 and not c.running
    assert c.capacity() == 2  # (η + 1) * B: its place went back to admission


def test_take_batch_takes_the_oldest_finished_groups_first() -> None:
    c = AdmissionControl(StalenessBudget(2, 2, 8))
    tickets = [c.admit() for _ in range(4)]
    for t in reversed(tickets):
        c.finish(t)
    assert c.take_batch() == tickets[:2]


def test_capacity_formula_by_hand() -> None:
    budget = StalenessBudget(groups_per_step=4, max_staleness=2, max_concurrent=10)
    # (2 + 3 + 1) * 4 = 24 groups may have been admitted by version 3; 12 trained + 5 waiting + 4 sampling = 21
    assert capacity(budget, version=3, trained=12, accepted=5, running=4) == 3
    assert capacity(budget, version=3, trained=12, accepted=0, running=9) == 1  # concurrency binds first
    with pytest.raises(ValueError):
        StalenessBudget(0, 1, 1)


def test_rejected_group_gives_its_place_back() -> None:
    c = AdmissionControl(StalenessBudget(1, 0, 4))
    t = c.admit()
    assert c.capacity() == 0
    c.finish(t)
    c.reject(t)  # dynamic sampling dropped it
    assert c.capacity() == 1 and c.take_batch() is None


def test_staleness_metrics_by_hand() -> None:
    # trainer at v5: trajectory A sampled by v3 (2 tokens) then v5 (1 token): ages 2, 2, 0, crossed an update;
    # trajectory B by v4 only: ages 1, 1. Mean (2 + 2 + 0 + 1 + 1) / 5 = 1.2, max 2, versions 2 and 1 -> 1.5.
    m = staleness_metrics(5, [[3, 3, 5], [4, 4], []])
    assert m.token_staleness_mean == pytest.approx(1.2) and m.token_staleness_max == 2
    assert m.versions_per_trajectory == 1.5 and m.crossed_update_share == 0.5
    assert m.as_metrics()["async/token_staleness_max"] == 2.0
    assert staleness_metrics(0, []).token_staleness_max == 0
    with pytest.raises(ValueError, match="newer"):
        staleness_metrics(1, [[2]])
