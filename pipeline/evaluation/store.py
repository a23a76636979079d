"""Per-sample records on disk: appended batch by batch, so a crashed evaluation resumes.

Each record is one sample (question, full response, tool calls, extracted answer, gold, score)
keyed by (run key, benchmark, problem id, sample index). The run key hashes everything that
changes a sample: the model's fingerprint, mode, protocol, decoding and rollout settings,
seed. On start, records of the same run key are kept and their problems skipped; anything
else in the file (another model, other settings) is dropped. A batch is appended with one
write and an fsync, so a crash leaves whole batches plus at most one torn last line, which
is ignored. At the end the file is rewritten in benchmark and problem order.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pipeline.jsonl import write_json_lines

SAMPLES_FILE = "eval_samples.jsonl"


def run_key(parts: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def record_key(record: dict[str, Any]) -> tuple[str, str, int]:
    return record["benchmark"], record["id"], record["sample"]


class SampleStore:
    """The samples file of one run key: what is done, append a batch, final ordered rewrite."""

    def __init__(self, path: Path, key: str, *, resume: bool) -> None:
        self.path, self.key = path, key
        self.records: dict[tuple[str, str, int], dict[str, Any]] = {}
        if resume and path.is_file():
            for record in _read_whole_lines(path):
                if record.get("run_key") == key:
                    self.records[record_key(record)] = record
        self.resumed = len(self.records)
        # Start the file from what is kept, so foreign or torn lines never linger.
        write_json_lines(path, self.records.values())

    def done(self, benchmark: str, problem_id: str, samples: int) -> bool:
        return all((benchmark, problem_id, i) in self.records for i in range(samples))

    def append(self, records: list[dict[str, Any]]) -> None:
        records = [{**r, "run_key": self.key} for r in records]
        text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        for r in records:
            self.records[record_key(r)] = r

    def ordered(self, order: list[tuple[str, str]], samples: int) -> list[dict[str, Any]]:
        """Records in the given (benchmark, problem id) order, each problem's samples in index order."""
        return [self.records[(b, pid, i)] for b, pid in order for i in range(samples)]

    def finalize(self, order: list[tuple[str, str]], samples: int) -> list[dict[str, Any]]:
        records = self.ordered(order, samples)
        write_json_lines(self.path, records)
        return records


def _read_whole_lines(path: Path) -> list[dict[str, Any]]:
    """Records of every complete, valid line; a torn line from a crash is skipped."""
    out = []
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and {"benchmark", "id", "sample"} <= obj.keys():
                out.append(obj)
    return out
