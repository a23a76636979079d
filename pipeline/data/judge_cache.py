"""A persistent cache of judge answers (SQLite), so a re-run or a crash never pays twice.

Each finished judge call is committed as soon as it completes; an interrupted run resumes by
asking only what is missing. Failed calls are not stored, so they are retried next time, and neither are the
answers of a judge (or a judges' tool) found broken (`forget`): the run after the fix asks again.

The key covers everything that changes the answer (judge name, model, system prompt, question,
temperature, token and tool budgets, tools offered) but not the endpoint URL, so moving a judge
to another host or port keeps its cache.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judge_answers (
    key TEXT PRIMARY KEY,
    judge TEXT NOT NULL,
    problem_id TEXT NOT NULL,
    answer TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class JudgeAnswer:
    """What one judge said about one question, with what it cost."""

    predicted: str | None  # the extracted final answer (None: the judge gave no \\boxed{} answer)
    content: str  # the judge's final message
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    requests: int


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


class JudgeCache:
    """key -> JudgeAnswer in one SQLite file; safe to open from several runs one after another."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives a crash of this process (what resuming needs) without an
        # fsync per answer, which would serialise the event loop on the disk.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def get(self, key: str) -> JudgeAnswer | None:
        row = self._db.execute("SELECT answer FROM judge_answers WHERE key = ?", (key,)).fetchone()
        return JudgeAnswer(**json.loads(row[0])) if row else None

    def put(self, key: str, judge: str, problem_id: str, answer: JudgeAnswer) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO judge_answers (key, judge, problem_id, answer) VALUES (?, ?, ?, ?)",
            (key, judge, problem_id, json.dumps(asdict(answer), sort_keys=True)),
        )
        self._db.commit()  # one commit per answer: a crash loses at most the calls in flight

    def forget(self, keys: list[str]) -> None:
        """Drop these answers (a broken judge's or tool's, `pipeline.data.broken`): the next run asks again."""
        self._db.executemany("DELETE FROM judge_answers WHERE key = ?", [(k,) for k in keys])
        self._db.commit()

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM judge_answers").fetchone()[0])

    def close(self) -> None:
        self._db.close()
