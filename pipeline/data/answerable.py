"""The `unanswerable` filter: keep a fact question only when the search tool can answer it.

A question is answerable when searching its own text shows one of its gold answers within what the policy
sees of the tool's output (the rollout cuts it to `rollout.max_tool_output_chars`). Training on a question
whose answer the corpus does not surface teaches guessing, and scoring one measures the corpus, not the policy.
The answer must appear as a whole phrase (`shows_answer`): 'dz' in 'adze' does not count.

The search itself is the caller's (`SearchProbe`: the curate flow asks the real search service). A search the
service fails is an outage, not a verdict: the probe raises and curation stops, so no row is rejected for it.
A service that answers every search with nothing (no results, refused: an empty or missing index) is broken,
not a verdict on the questions either: the probe raises `BrokenDependency` naming it (`pipeline.data.broken`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.config.search import SearchConfig
from pipeline.data.broken import refuse_if_all_useless
from pipeline.data.sources import Rejection
from pipeline.rollout.offered import TOOLS_FOR_TYPE
from pipeline.tools.search import SearchClient
from pipeline.tools.shown import cut_middle
from pipeline.types import Problem, ToolResult


@dataclass(frozen=True)
class SearchProbe:
    """What the policy would see of a search for each question (already cut to the rollout's budget), and the
    service that answers them, named in the errors of the filters it decides."""

    search: Callable[[Sequence[str]], list[str]]
    service: str  # e.g. "the search service at http://127.0.0.1:8001 (index data/search/index)"

    def __call__(self, questions: Sequence[str]) -> list[str]:
        return self.search(questions)


def shows_answer(visible: str, answers: Sequence[str]) -> str | None:
    """The first gold answer `visible` contains as a whole phrase (case-insensitive), or None."""
    text = visible.casefold()
    for answer in answers:
        pattern = r"(?<!\w)" + re.escape(answer.casefold().strip()) + r"(?!\w)"
        if answer.strip() and re.search(pattern, text):
            return answer
    return None


def drop_unanswerable(problems: list[Problem], checked: Callable[[Problem], bool],
                      probe: SearchProbe | None) -> tuple[list[Problem], list[Rejection]]:
    """Rows `checked` selects are kept only when `probe` shows one of their answers; other rows pass."""
    asked = [p for p in problems if checked(p)]
    if not asked:
        return problems, []
    if probe is None:
        raise ValueError(f"{len(asked)} rows need the unanswerable filter (curate.wiki_facts.answerable_only or a "
                         "source's answerable_only) but no search service was given")
    visible = probe([p.question for p in asked])
    if len(visible) != len(asked):
        raise RuntimeError(f"the search probe answered {len(visible)} of {len(asked)} questions")
    unanswered = {p.id for p, shown in zip(asked, visible) if shows_answer(shown, p.answers) is None}
    kept = [p for p in problems if p.id not in unanswered]
    rejected = [Rejection.of(p, "unanswerable", "searching the question shows none of its answers within the "
                             "tool output the policy sees") for p in problems if p.id in unanswered]
    return kept, rejected


def service_probe(cfg: SearchConfig, url: str, max_output_chars: int) -> SearchProbe:
    """A probe that asks the search service at `url` and cuts each output as the rollout does; a search the
    service fails raises (naming it), so an outage never rejects a row, and so does a service that finds
    nothing for any question."""
    service = f"the search service at {url} (provider {cfg.provider}, index {cfg.index_dir})"

    def probe(questions: Sequence[str]) -> list[str]:
        results = asyncio.run(_search_all(cfg, url, questions))
        failed = [r for r in results if r.infrastructure]
        if failed:
            raise RuntimeError(f"the search service at {url} failed {len(failed)} of {len(results)} searches "
                               f"({failed[0].error}); no row was rejected for it")
        refuse_if_all_useless(service, results, "the unanswerable filter (one search per question)")
        return [cut_middle(r.output.strip(), max_output_chars) if r.ok else "" for r in results]
    return SearchProbe(probe, service)


async def _search_all(cfg: SearchConfig, url: str, questions: Sequence[str]) -> list[ToolResult]:
    client = SearchClient.from_config(cfg, url)
    try:
        return list(await asyncio.gather(*(client(q) for q in questions)))
    finally:
        await client.aclose()


SEARCH_PROBES = 8  # questions a stage asks the search service before it starts: a broken one finds nothing


def search_probes(problems: Sequence[Problem], n: int = SEARCH_PROBES) -> list[Problem]:
    """Up to `n` of the problems that are offered the search tool (a fact question is, a calculation is not)."""
    return [p for p in problems if "search" in TOOLS_FOR_TYPE.get(p.type, ())][:n]


def refuse_search_that_answers_nothing(cfg: SearchConfig, url: str, probes: Sequence[Problem], doing: str) -> None:
    """Ask the search service at `url` the stage's own questions `probes` through the client the rollouts use, and
    raise `BrokenDependency` when it answers none of them with anything (no results, refusals, failures).

    A policy's queries finding nothing is an observation; a service that finds nothing for any of a stage's own
    questions is broken (an empty or missing index, a provider refusing everything), and a stage run on it would
    train or evaluate a search tool that cannot help, silently. Finding the *answers* is not asked here: a
    benchmark's questions need not be answerable from the index (curation asks that of the data it keeps)."""
    if probes:
        service = f"the search service at {url} (provider {cfg.provider}, index {cfg.index_dir})"
        refuse_if_all_useless(service, asyncio.run(_ask(cfg, url, [p.question for p in probes])), doing)


async def _ask(cfg: SearchConfig, url: str, questions: Sequence[str]) -> list[ToolResult]:
    client = SearchClient.from_config(cfg, url)
    try:
        return list(await asyncio.gather(*(client(q) for q in questions)))
    finally:
        await client.aclose()
