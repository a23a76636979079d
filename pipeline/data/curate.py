"""The curation stage: Calculator + Wikipedia facts + sources -> filters -> multi-LLM filtering -> split files.

`run(cfg)` writes, under `cfg.output_dir`:
- `train.jsonl`, `test.jsonl`: one `Problem.to_dict()` a line, in config order (calculator
  first, then the embedded dump's fact questions, then each source in file order);
- `rejected.jsonl`: every row that did not make it, with its source, file, line, filter and
  reason — nothing is dropped silently;
- `report.json`: counts per source and per filter, and judge token/cost totals.

Filters run cheapest first so judges are only paid for rows that passed everything else:
malformed -> invalid answer -> time-ambiguous rules -> duplicates -> contamination ->
too long -> unanswerable -> time-ambiguity LLM judge (optional) -> multi-LLM judges.
With `offer_all_tools` every row becomes type complex (both tools offered) after the duplicate checks, which
read the original types, and before "too long", which must measure the prompt training will show.
"unanswerable" (`pipeline.data.answerable`) keeps a fact question the search service can answer: for the
generated Wikipedia facts (`wiki_facts.answerable_only`) and sources with `answerable_only`.
"too long" rejects a row whose chat-templated prompt leaves no room for a full response within the
rollout's token budget, encoded exactly as training's load-time check encodes it
(`pipeline.rollout.prompt_budget.prompt_overruns`), so a kept row is never refused when training loads
it. It needs the tokenizer of the model the run trains (`prompt_budget`); without one the filter is
skipped, and the log and report.json (`prompt_budget`) say so.
Duplicates are resolved with test rows first, so a training row that repeats a test row is
the one dropped. Generated calculator rows are exempt from the n-gram contamination check
(their shared template wording would match; the generator already keeps train and test
questions disjoint) but not from exact-duplicate checks.

Outputs depend only on the config and the input files: no timestamps or timings are written,
so a re-run is byte-identical. Timings and cache hits are returned in `CurationReport.run_stats`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from pipeline.config.curate import CurateConfig, FilterConfig
from pipeline.data import wiki_facts
from pipeline.data.answerable import SearchProbe, drop_unanswerable
from pipeline.data.broken import read_per_source, refuse_degenerate_rejections
from pipeline.data.calculator import generate_splits
from pipeline.data.dedupe import Deduper, NgramIndex
from pipeline.data.filters import rule_rejection
from pipeline.data.formats import SourceError
from pipeline.data.judging import ToolFactory, judge_filter
from pipeline.data.sources import Rejection, load_source, location
from pipeline.data.time_judge import time_judge_filter
from pipeline.jsonl import write_json, write_json_lines, write_problems
from pipeline.paths import embedded_wiki_dump
from pipeline.types import Problem

if TYPE_CHECKING:
    from pipeline.rollout.prompt_budget import PromptBudget

log = logging.getLogger(__name__)

FILTERS: tuple[str, ...] = ("malformed", "invalid_answer", "time_ambiguous", "duplicate", "near_duplicate",
                            "contamination", "too_long", "unanswerable", "judges")
NO_BUDGET = "not checked: no tokenizer of the model to train (prepare the model before curating)"


@dataclass(frozen=True)
class CurationReport:
    """What a curation run kept and dropped. `to_dict()` is what report.json holds."""

    output_dir: str
    n_train: int
    n_test: int
    n_rejected: int
    per_source: dict[str, dict[str, int]]
    per_filter: dict[str, int]
    judges: dict[str, dict[str, float]] = field(default_factory=dict)
    prompt_budget: str = NO_BUDGET  # whether rows were checked against the rollout's token budget
    run_stats: dict[str, float] = field(default_factory=dict)  # timings, cache hits: not written

    def to_dict(self) -> dict[str, Any]:
        return {"n_train": self.n_train, "n_test": self.n_test, "n_rejected": self.n_rejected,
                "per_source": self.per_source, "per_filter": self.per_filter, "judges": self.judges,
                "prompt_budget": self.prompt_budget}


def _progress(items: Iterable[Any], desc: str) -> Iterable[Any]:
    return tqdm(items, desc=desc, unit="row", disable=not sys.stderr.isatty(), leave=False)


def check_sources(cfg: CurateConfig) -> None:
    """Fail at once, naming the source and file, before any work is done."""
    for src in cfg.sources:
        if src.path and not Path(src.path).is_file():
            raise SourceError(f"source {src.name!r}: no such file {src.path}")


def read_all(cfg: CurateConfig) -> tuple[list[Problem], list[Rejection]]:
    """Calculator problems, the embedded dump's fact questions and every configured source, in config order."""
    train, test = generate_splits(cfg.calculator.n_train, cfg.calculator.n_test, cfg.seed, cfg.calculator.levels)
    problems: list[Problem] = [*train, *test]
    if cfg.wiki_facts.enabled:
        facts = wiki_facts.generate(embedded_wiki_dump())
        train, test = wiki_facts.split_by_page(facts, cfg.wiki_facts.test_fraction, cfg.seed)
        problems += [*train, *test]
    rejections: list[Rejection] = []
    for src in cfg.sources:
        for item in _progress(load_source(src, cfg.seed, cfg.test_fraction), f"read {src.name}"):
            (problems if isinstance(item, Problem) else rejections).append(item)
        log.info("read %s (%s)", src.name, location(src))
    return problems, rejections


def apply_rules(problems: list[Problem], cfg: FilterConfig) -> tuple[list[Problem], list[Rejection]]:
    kept, rejected = [], []
    for p in _progress(problems, "rules"):
        verdict = rule_rejection(p, cfg)
        if verdict:
            rejected.append(Rejection.of(p, *verdict))
        else:
            kept.append(p)
    return kept, rejected


def drop_duplicates(problems: list[Problem], cfg: FilterConfig) -> tuple[list[Problem], list[Rejection]]:
    """Exact and near duplicates; test rows are seen first so train copies are the ones dropped."""
    order = sorted(range(len(problems)), key=lambda i: (problems[i].split != "test", i))
    deduper = Deduper(cfg.near_duplicate_threshold)
    dropped: dict[int, Rejection] = {}
    by_id = {p.id: p for p in problems}
    for i in _progress(order, "dedupe"):
        p = problems[i]
        if not cfg.exact_duplicates and cfg.near_duplicate_threshold <= 0:
            break
        hit = deduper.check(p.id, p.question, p.answers, near=p.type in cfg.near_duplicate_types)
        if hit is None or (hit[0] == "exact" and not cfg.exact_duplicates):
            continue
        kind, other = hit
        where = f" in split {by_id[other].split}" if by_id[other].split != p.split else ""
        name = "duplicate" if kind == "exact" else "near_duplicate"
        dropped[i] = Rejection.of(p, name, f"{kind} duplicate of {other}{where}")
    kept = [p for i, p in enumerate(problems) if i not in dropped]
    return kept, [dropped[i] for i in sorted(dropped)]


def drop_contaminated(problems: list[Problem], n: int) -> tuple[list[Problem], list[Rejection]]:
    """Training rows sharing an n-gram with a test row (generated calculator rows exempt)."""
    if n <= 0:
        return problems, []
    index = NgramIndex(n)
    for p in problems:
        if p.split == "test":
            index.add(p.id, p.question)
    kept, rejected = [], []
    for p in _progress(problems, "contamination"):
        hit = None if p.split == "test" or p.source == "calculator" else index.overlap(p.question)
        if hit:
            rejected.append(Rejection.of(p, "contamination", f"shares {n}-gram '{hit[1]}' with test row {hit[0]}"))
        else:
            kept.append(p)
    return kept, rejected


def drop_too_long(problems: list[Problem], budget: PromptBudget | None) -> tuple[list[Problem], list[Rejection], str]:
    """Rows whose prompt leaves no room for a full response; what was checked, for the report."""
    if budget is None:
        log.warning("curate: prompt lengths %s", NO_BUDGET)
        return problems, [], NO_BUDGET
    from pipeline.rollout.prompt_budget import prompt_overruns  # the rollout's encoding: torch, only when asked

    over = dict(prompt_overruns(problems, budget))
    kept = [p for i, p in enumerate(problems) if i not in over]
    rejected = [Rejection.of(problems[i], "too_long", budget.reason(n)) for i, n in over.items()]
    return kept, rejected, (f"checked: prompts of at most {budget.room} tokens (rollout.max_total_tokens - "
                            f"rollout.max_policy_tokens), protocol {budget.rollout.protocol}")


def offering_all_tools(problems: list[Problem]) -> list[Problem]:
    """Every problem as type complex (both tools offered); its source still routes the verifier."""
    return [Problem(p.id, p.question, p.answers, "complex", p.source, p.split, p.meta) for p in problems]


def needs_answer_check(cfg: CurateConfig) -> Callable[[Problem], bool]:
    """Which rows the unanswerable filter checks: generated facts (when asked) and sources marked answerable_only."""
    sources = {s.name for s in cfg.sources if s.answerable_only}
    if cfg.wiki_facts.enabled and cfg.wiki_facts.answerable_only:
        sources.add(wiki_facts.SOURCE)
    return lambda problem: problem.source in sources


def summarize(cfg: CurateConfig, read: list[Problem], kept: list[Problem], rejected: list[Rejection]) -> tuple[
        dict[str, dict[str, int]], dict[str, int]]:
    names = ["calculator", *([wiki_facts.SOURCE] if cfg.wiki_facts.enabled else []), *(s.name for s in cfg.sources)]
    per_source: dict[str, dict[str, int]] = {n: {"read": 0, "train": 0, "test": 0, "rejected": 0} for n in names}
    for p in read:
        per_source[p.source]["read"] += 1
    for p in kept:
        per_source[p.source][p.split] += 1
    for r in rejected:
        row = per_source[r.source]
        row["rejected"] += 1
        row[f"rejected:{r.filter}"] = row.get(f"rejected:{r.filter}", 0) + 1
        if r.filter == "malformed" and not r.id:
            row["read"] += 1  # unreadable rows never became a Problem
    counts = Counter(r.filter for r in rejected)
    return per_source, {f: counts.get(f, 0) for f in FILTERS}


@dataclass
class Filtering:
    """The rows still kept and every rejection so far. Each filter's outcome is checked as it lands
    (`pipeline.data.broken`): one filter rejecting a whole source, or more than `curate.max_rejected_share` of
    it, stops the stage naming what decides that filter, before a judge is paid for the rest."""

    kept: list[Problem]
    rejected: list[Rejection]
    read: Counter[str]
    max_share: float

    def took(self, kept: list[Problem], dropped: list[Rejection], decided_by: str) -> None:
        self.kept, self.rejected = kept, self.rejected + dropped
        refuse_degenerate_rejections(dropped, self.rejected, self.read, self.max_share, decided_by)


ROWS_THEMSELVES = "the rows themselves (their source file and adapter), not a service"


def judges_named(cfg: CurateConfig, names: Iterable[str] | None = None) -> str:
    """The judges (all, or those named) as the errors name them: name, model and endpoint."""
    chosen = [j for j in cfg.multi_llm.judges if names is None or j.name in names]
    return ", ".join(f"judge {j.name!r} (model {j.model} at {j.base_url})" for j in chosen)


def run(cfg: CurateConfig, tool_factory: ToolFactory | None = None,
        prompt_budget: PromptBudget | None = None, search: SearchProbe | None = None) -> CurationReport:
    """Curate, write the split files, rejected rows and report; return the report.

    `tool_factory` builds the judges' tools inside the judging event loop; by default they are
    clients of `multi_llm.code_url` and `multi_llm.search_url`. `prompt_budget` (the trained model's
    tokenizer, the rollout config, the tools training offers) enables the "too_long" filter; `search` (what the
    policy would see of a search for each question) the "unanswerable" one, which `cfg.needs_search()` says
    is configured (without a probe it raises). A filter that rejects a whole source (or more than
    `cfg.max_rejected_share` of it) raises `BrokenDependency` and nothing is written.
    """
    started = time.perf_counter()
    check_sources(cfg)
    read, unreadable = read_all(cfg)
    rows = Filtering(read, [], read_per_source(read, unreadable), cfg.max_rejected_share)
    rows.took(read, unreadable, ROWS_THEMSELVES)
    rows.took(*apply_rules(rows.kept, cfg.filters), ROWS_THEMSELVES)
    rows.took(*drop_duplicates(rows.kept, cfg.filters), ROWS_THEMSELVES)
    rows.took(*drop_contaminated(rows.kept, cfg.filters.contamination_ngram), ROWS_THEMSELVES)
    if cfg.offer_all_tools:
        rows.kept = offering_all_tools(rows.kept)
    kept, dropped, budget_checked = drop_too_long(rows.kept, prompt_budget)
    rows.took(kept, dropped, "the tokenizer of the model to train (model.base_dir) and the rollout's token budget")
    rows.took(*drop_unanswerable(rows.kept, needs_answer_check(cfg), search),
              search.service if search is not None else "the search service")
    judge_totals: dict[str, dict[str, float]] = {}
    run_stats: dict[str, float] = {}
    if cfg.filters.time_judge:
        kept, dropped, totals, stats = time_judge_filter(rows.kept, cfg)
        rows.took(kept, dropped, f"the time judge, {judges_named(cfg, [cfg.filters.time_judge])}")
        judge_totals, run_stats = {**judge_totals, **totals}, {**run_stats, **stats}
    if cfg.multi_llm.judges and any(s.judge for s in cfg.sources):
        kept, dropped, totals, stats = judge_filter(rows.kept, cfg, tool_factory)
        rows.took(kept, dropped, f"the judges, {judges_named(cfg)} (and the tools they call)")
        judge_totals, run_stats = {**judge_totals, **totals}, {**run_stats, **stats}
    kept, rejected = rows.kept, rows.rejected
    out = Path(cfg.output_dir)
    n_train = write_problems(out / "train.jsonl", (p for p in kept if p.split == "train"))
    n_test = write_problems(out / "test.jsonl", (p for p in kept if p.split != "train"))
    write_json_lines(out / "rejected.jsonl", (r.to_dict() for r in rejected))
    per_source, per_filter = summarize(cfg, read, kept, rejected)
    report = CurationReport(str(out), n_train, n_test, len(rejected), per_source, per_filter, judge_totals,
                            budget_checked,
                            {**run_stats, "rows_read": float(len(read) + sum(1 for r in rejected if not r.id)),
                             "wall_s": time.perf_counter() - started})
    write_json(out / "report.json", report.to_dict())
    log.info("curated %d train, %d test, %d rejected into %s", n_train, n_test, len(rejected), out)
    return report
