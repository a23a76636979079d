"""The record a search provider returns: one passage (or web result) with its score."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str every surrogate is a lone one


def clean_text(value: object) -> str:
    """`value` as text any encoder can write: a provider's JSON may escape lone surrogates (`"\\ud83d"`),
    which would make the answer, the cache entry and the model's prompt unwritable; each becomes U+FFFD."""
    return _LONE_SURROGATE.sub("\ufffd", str(value))


@dataclass(frozen=True)
class Passage:
    """One result. `id` is the corpus passage id (local index) or the rank-based id of a web result."""

    id: str
    title: str
    text: str
    url: str | None = None
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Passage:
        return cls(id=str(row["id"]), title=str(row["title"]), text=str(row["text"]),
                   url=row.get("url"), score=float(row.get("score", 0.0)))

    @property
    def contents(self) -> str:
        """Search-R1 / wiki-18 document text: the quoted title, a newline, the passage."""
        return f'"{self.title}"\n{self.text}'
