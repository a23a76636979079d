"""JSON Lines reading and writing of records, with errors that name the file and line."""

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
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
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
    os.replace(tmp, path)
    return n


def read_problems(path: str | Path) -> list[Problem]:
    """Read a curated split file into `Problem`s."""
    problems = []
    for lineno, row in iter_json_lines(path):
        try:
            problems.append(Problem.from_dict(row))
        except ValueError as err:
            raise ValueError(f"{path}:{lineno}: {err}") from None
    return problems


def write_problems(path: str | Path, problems: Iterable[Problem]) -> int:
    return write_json_lines(path, (p.to_dict() for p in problems))


def write_json(path: str | Path, obj: Any) -> None:
    """Write one JSON document atomically (metrics files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
