"""Read one configured source into `Problem`s plus a `Rejection` for every row it could not use.

Ids are `<source>-<sha1 of the question>[:12]`: stable across runs, file reorderings and limits.
Each problem's `meta` records where it came from (`file`, `line`) so any row can be traced back.
The split of a `holdout` source is a seeded hash of the id, so it does not depend on row order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config.curate import SourceConfig
from pipeline.data.adapters import RowError, get_adapter
from pipeline.data.formats import RawRow, SourceError, read_file, read_hub
from pipeline.types import Problem, Split


@dataclass(frozen=True)
class Rejection:
    """One dropped row: where it came from, which filter dropped it and why."""

    source: str
    file: str
    line: int
    filter: str
    reason: str
    id: str = ""
    question: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "file": self.file, "line": self.line, "filter": self.filter,
                "reason": self.reason, "id": self.id, "question": self.question[:300]}

    @classmethod
    def of(cls, problem: Problem, filter_name: str, reason: str) -> Rejection:
        return cls(problem.source, str(problem.meta.get("file", "")), int(problem.meta.get("line", 0)),
                   filter_name, reason, problem.id, problem.question)


def problem_id(source: str, question: str) -> str:
    return f"{source}-{hashlib.sha1(question.encode('utf-8')).hexdigest()[:12]}"


def holdout_split(seed: int, pid: str, test_fraction: float) -> Split:
    digest = hashlib.sha256(f"{seed}:{pid}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < test_fraction else "train"


def location(cfg: SourceConfig) -> str:
    return cfg.path or f"hub:{cfg.hub_id}" + (f"/{cfg.hub_config}" if cfg.hub_config else "") + f"[{cfg.hub_split}]"


def raw_rows(cfg: SourceConfig) -> Iterator[RawRow]:
    """Rows of the configured file or hub dataset; SourceError at once if it cannot be opened."""
    if cfg.path:
        rows = read_file(Path(cfg.path), cfg.format)
    else:
        rows = read_hub(cfg.hub_id, cfg.hub_config, cfg.hub_split)
    count = 0
    try:
        for row in rows:
            count += 1
            yield row
    except SourceError:
        raise
    except (OSError, UnicodeError, ValueError) as err:
        raise SourceError(f"source {cfg.name!r} ({location(cfg)}): {err}") from err
    if count == 0:  # a configured source that adds nothing is a wrong path or a truncated download
        raise SourceError(f"source {cfg.name!r} ({location(cfg)}): no rows (the file is empty)")


def load_source(cfg: SourceConfig, seed: int, test_fraction: float) -> Iterator[Problem | Rejection]:
    """Every row of a source in file order, as a Problem or a Rejection (filter 'malformed')."""
    adapter = get_adapter(cfg.adapter)
    where = location(cfg)
    for n, raw in enumerate(raw_rows(cfg), start=1):
        if cfg.limit and n > cfg.limit:
            break
        if raw.data is None:
            yield Rejection(cfg.name, where, raw.line, "malformed", raw.error or "unreadable row")
            continue
        try:
            question, answers, meta = adapter(raw.data)
        except RowError as err:
            yield Rejection(cfg.name, where, raw.line, "malformed", str(err))
            continue
        pid = problem_id(cfg.name, question)
        split: Split = holdout_split(seed, pid, test_fraction) if cfg.split == "holdout" else cfg.split
        yield Problem(id=pid, question=question, answers=tuple(answers), type=cfg.type, source=cfg.name,
                      split=split, meta={**meta, "file": where, "line": raw.line})
