"""Problem streams: seeded, resumable from the cursor alone; the balanced one alternates sources."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.sampling.problem_stream import ProblemStream, SourceBalancedStream, problem_stream
from pipeline.types import Problem


def mix(n_a: int, n_b: int) -> list[Problem]:
    make = lambda source, i: Problem(f"{source}-{i}", f"q{i}", ("x",), "complex", source, "train")  # noqa: E731
    return [make("a", i) for i in range(n_a)] + [make("b", i) for i in range(n_b)]


@pytest.mark.parametrize("kind", [ProblemStream, SourceBalancedStream])
def test_a_resumed_stream_draws_what_the_uninterrupted_one_draws(kind) -> None:
    whole = kind(mix(7, 3), seed=5).take(25)
    first = kind(mix(7, 3), seed=5)
    head = first.take(11)
    tail = kind(mix(7, 3), seed=5, cursor=first.cursor).take(14)
    assert [p.id for p in head + tail] == [p.id for p in whole]


def test_uniform_stream_visits_every_problem_once_per_epoch_in_a_seeded_order() -> None:
    problems = mix(7, 3)
    epoch = ProblemStream(problems, seed=5).take(10)
    assert sorted(p.id for p in epoch) == sorted(p.id for p in problems)
    assert [p.id for p in epoch] != [p.id for p in ProblemStream(problems, seed=6).take(10)]


def test_balanced_stream_alternates_sources_whatever_their_sizes() -> None:
    drawn = SourceBalancedStream(mix(20, 3), seed=1).take(12)
    assert [p.source for p in drawn] == ["a", "b"] * 6
    small = [p.id for p in drawn if p.source == "b"]
    assert sorted(small[:3]) == ["b-0", "b-1", "b-2"]  # a small source repeats only after each of its problems
    assert Counter(small)["b-0"] == 2


def test_uniform_draw_follows_the_mix_proportions() -> None:
    drawn = ProblemStream(mix(20, 2), seed=1).take(22)
    assert Counter(p.source for p in drawn) == {"a": 20, "b": 2}


def test_the_config_flag_picks_the_stream() -> None:
    assert type(problem_stream(mix(2, 2), 0, 0, balance_sources=True)) is SourceBalancedStream
    assert type(problem_stream(mix(2, 2), 0, 0, balance_sources=False)) is ProblemStream
    with pytest.raises(ValueError, match="no training problems"):
        problem_stream([], 0, 0, balance_sources=True)
