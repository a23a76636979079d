"""JSON Lines reading and writing of records, with errors that name the file and line.

Writes are whole or absent, and durable: written beside the file, fsynced, renamed into place, the folder fsynced
(the rule of `pipeline.outputs`, repeated here in `_replace_durably` because both sit in the lowest layer)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipeline.types import Problem


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for each non-blank line; raise naming file:line."""
    path = Path(path)
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not UTF-8 (byte {err.start + 1} of the line: "
                                 f"{raw[err.start:err.start + 1]!r})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON: {err.msg}") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def write_json_lines(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows atomically (temp file + rename), keys sorted for byte-stable output."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
        _replace_durably(fh, tmp, path)
    return n


def read_problems(path: str | Path) -> list[Problem]:
    """Read a curated split file into `Problem`s."""
    return [problem for _, problem in read_problem_rows(path)]


def read_problem_rows(path: str | Path) -> list[tuple[int, Problem]]:
    """(line, problem) for each row of a curated split file; raises naming the file, line and key.

    A row must have a non-empty question and at least one non-empty answer (no reward can be computed
    without one): what curation guarantees, checked again for files made or edited by hand."""
    rows = []
    for lineno, row in iter_json_lines(path):
        try:
            problem = Problem.from_dict(row)
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from None
        if not problem.question.strip():
            raise ValueError(f"{path}:{lineno}: question: empty")
        if not problem.answers:
            raise ValueError(f"{path}:{lineno}: answers: empty list (a problem needs at least one accepted answer)")
        blank = [i for i, answer in enumerate(problem.answers) if not answer.strip()]
        if blank:
            raise ValueError(f"{path}:{lineno}: answers[{blank[0]}]: empty answer")
        rows.append((lineno, problem))
    return rows


def write_problems(path: str | Path, problems: Iterable[Problem]) -> int:
    return write_json_lines(path, (p.to_dict() for p in problems))


def write_json(path: str | Path, obj: Any) -> None:
    """Write one JSON document atomically and durably (metrics files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        _replace_durably(fh, tmp, path)


def _replace_durably(fh: Any, tmp: Path, path: Path) -> None:
    """The open `tmp` flushed to the disk and renamed to `path`, and `path`'s folder flushed: a killed process or
    a power cut leaves the old file or the new one, never a renamed file whose data was not written back."""
    fh.flush()
    os.fsync(fh.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
