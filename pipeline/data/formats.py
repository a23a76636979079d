"""Read raw rows from JSONL, JSON, CSV and parquet files or a hub dataset, one `RawRow` each.

A row that cannot be read (bad JSON, invalid UTF-8, not an object) becomes a `RawRow` with an
`error` instead of raising, so one bad line never stops a run; a missing file or an unknown
format raises `SourceError` at once, naming the file.

`line` is the physical line for JSONL and CSV and the 1-based record number for JSON arrays,
parquet and hub datasets (those have no meaningful lines).

Invalid UTF-8 is detected per row: files are decoded with `surrogateescape`, so undecodable
bytes become lone surrogates that we find in the row's strings instead of failing the file.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SURROGATE = re.compile("[\udc80-\udcff]")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


class SourceError(ValueError):
    """A source that cannot be read at all (missing file, unknown format)."""


@dataclass(frozen=True)
class RawRow:
    line: int
    data: dict[str, Any] | None
    error: str | None = None


def resolve_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    try:
        return _EXTENSIONS[path.suffix.lower()]
    except KeyError:
        raise SourceError(f"{path}: cannot tell the format from extension {path.suffix!r}; "
                          f"set format to one of {sorted(set(_EXTENSIONS.values()))}") from None


def read_file(path: Path, fmt: str = "auto") -> Iterator[RawRow]:
    """Rows of a local file; raises SourceError naming the file if it is missing."""
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    readers = {"jsonl": _read_jsonl, "json": _read_json, "csv": _read_csv, "parquet": _read_parquet}
    kind = resolve_format(path, fmt)
    if kind not in readers:
        raise SourceError(f"{path}: unknown format {kind!r}")
    return readers[kind](path)


def _checked(line: int, obj: Any) -> RawRow:
    if not isinstance(obj, dict):
        return RawRow(line, None, f"expected a JSON object, got {type(obj).__name__}")
    if _has_surrogates(obj):
        return RawRow(line, None, "invalid UTF-8")
    return RawRow(line, obj)


def _has_surrogates(value: Any) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogates(k) or _has_surrogates(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_surrogates(v) for v in value)
    return False


def _read_jsonl(path: Path) -> Iterator[RawRow]:
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            if _SURROGATE.search(line):
                yield RawRow(lineno, None, "invalid UTF-8")
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                yield RawRow(lineno, None, f"not valid JSON: {err.msg}")
                continue
            yield _checked(lineno, obj)


def _read_json(path: Path) -> Iterator[RawRow]:
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise SourceError(f"{path}: not valid JSON at line {err.lineno}: {err.msg}") from None
    if isinstance(doc, dict):
        # {"data": [...]}-style wrappers: take the one list of records.
        lists = [v for v in doc.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise SourceError(f"{path}: expected a JSON array of records or an object holding exactly one")
        doc = lists[0]
    if not isinstance(doc, list):
        raise SourceError(f"{path}: expected a JSON array of records, got {type(doc).__name__}")
    for index, obj in enumerate(doc, start=1):
        yield _checked(index, obj)


def _read_csv(path: Path) -> Iterator[RawRow]:
    with path.open("r", encoding="utf-8", errors="surrogateescape", newline="") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            line = reader.line_num
            if None in row or any(v is None for v in row.values()):
                yield RawRow(line, None, f"expected {len(reader.fieldnames or [])} columns")
                continue
            yield _checked(line, dict(row))


def _read_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq  # heavy import, only for parquet sources

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for obj in batch.to_pylist():
            index += 1
            yield _checked(index, obj)


def read_hub(hub_id: str, config: str, split: str) -> Iterator[RawRow]:
    """Rows of a Hugging Face dataset (or a local dataset folder) through `datasets`."""
    import datasets  # heavy import, only for hub sources

    try:
        ds = datasets.load_dataset(hub_id, name=config or None, split=split)
    except Exception as err:  # datasets raises many types; all mean "this source is unusable"
        raise SourceError(f"hub dataset {hub_id!r} (config {config!r}, split {split!r}): {err}") from err
    for index, obj in enumerate(ds, start=1):
        yield _checked(index, obj)
