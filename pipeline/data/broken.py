"""A dependency that answers but is broken stops the stage, naming it.

An outage (a service that cannot be reached, answers 5xx or garbage) already stops curation and the SFT
teacher before any row is rejected for it. This module covers the other half: a service that answers every
call, uselessly. A search service over an empty or wrong index finds nothing for any question; a judge boxes
no answer; a sandbox fails every program. Each answer alone is a plausible verdict on one row, but all of
them together say something about the service. Curation would reject every row and write an empty set (exit 0),
and the SFT teacher would quietly teach one tool. Instead:

* `refuse_degenerate_rejections`: when one filter rejects a whole source, or more than
  `curate.max_rejected_share` of its rows, the stage fails naming the source, the filter with one of its
  reasons, and what decides that filter (the search service, the judges, the tokenizer, the rows themselves);
* `refuse_if_all_useless`: when every answer of one service shows nothing (empty, "no results", refused),
  the stage fails naming the service, however few the calls;
* `pipeline.data.answerable.refuse_search_that_answers_nothing`: a stage that offers search (train, evaluate)
  first asks the service a few of its own questions, and fails naming it when it finds nothing for any.

Both run before anything is written, so a failed stage leaves no half-made output for DVC to record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from pipeline.data.sources import Rejection
from pipeline.types import Problem, ToolResult

# What the search client shows for a search that found nothing (pipeline.tools.search); the empty-service test
# (tests/data/test_broken_services.py) runs against the real client, so a change of wording there fails it.
NO_RESULTS = "No results found."


class BrokenDependency(RuntimeError):
    """A service the stage depends on answered, but uselessly: the message names the service and what it did."""


def shows_nothing(result: ToolResult) -> bool:
    """A tool answer that carries nothing to use: a failure of any kind, an empty output, or no results."""
    text = result.output.strip()
    return not result.ok or not text or text == NO_RESULTS


def refuse_if_all_useless(service: str, results: Sequence[ToolResult], doing: str) -> None:
    """Raise `BrokenDependency` when `results` (what `service` answered while `doing`) are all useless."""
    if results and all(shows_nothing(r) for r in results):
        sample = results[0].error or results[0].output.strip() or "(empty output)"
        raise BrokenDependency(f"{service} answered none of the {len(results)} calls of {doing} with anything to "
                               f"use (e.g. {sample[:120]!r}): is it serving what it should (its index, its "
                               "configuration)? Nothing was written.")


def read_per_source(read: Sequence[Problem], rejected: Sequence[Rejection]) -> Counter[str]:
    """Rows read per source: the problems read plus the rows that never became a problem (malformed, no id)."""
    counts: Counter[str] = Counter(p.source for p in read)
    counts.update(r.source for r in rejected if not r.id)
    return counts


def refuse_degenerate_rejections(step: Sequence[Rejection], so_far: Sequence[Rejection], read: Mapping[str, int],
                                 max_share: float, decided_by: str) -> None:
    """Raise `BrokenDependency` when a filter that rejected rows in this `step` has now rejected all of a
    source's rows, or more than `max_share` of them (counted over `so_far`, every rejection up to now)."""
    touched = {(r.source, r.filter) for r in step}
    if not touched:
        return
    totals = Counter((r.source, r.filter) for r in so_far)
    for source, name in sorted(touched):
        n, of = totals[(source, name)], read.get(source, 0)
        if of and (n >= of or n > max_share * of):
            reason = next(r.reason for r in step if (r.source, r.filter) == (source, name))
            raise BrokenDependency(
                f"curate: filter {name!r} rejected {n} of the {of} rows of source {source!r} (all of them, or more "
                f"than curate.max_rejected_share {max_share:g}), e.g. {reason[:160]!r}; that filter is decided by "
                f"{decided_by}. Nothing was written.")


def service_of(name: str, tool: object) -> str:
    """How an error names a tool's service: its URL where the client has one (code, search)."""
    url = getattr(tool, "url", None)
    return f"the {name} service at {url}" if url else f"the {name} tool"


def refuse_if_none_kept(asked: Mapping[str, int], kept: Mapping[str, int], services: Mapping[str, str],
                        doing: str) -> None:
    """Raise `BrokenDependency` when a tool was called (`asked`) and not one of its answers was kept: every call
    failed, found nothing, or showed nothing the verifier accepts (a sandbox failing every program, a search
    service over the wrong index)."""
    for name, n in sorted(asked.items()):
        if n and not kept.get(name):
            raise BrokenDependency(f"{services.get(name, name)} answered none of the {n} calls of {doing} "
                                   "usefully (each failed, was empty, or showed no accepted answer): is it serving "
                                   "what it should? Nothing was written.")

