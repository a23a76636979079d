"""The record a search provider returns: one passage (or web result) with its score."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
