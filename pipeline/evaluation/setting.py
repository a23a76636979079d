"""What makes two evaluations comparable: the same problems (split and a hash of every evaluated problem),
samples, temperature, protocol and mode. The registry moves `champion` only between evaluations of the same
setting (`pipeline.tracking.registry.update_champion`), so 62.5% on 8 problems never "beats" 45.8% on 24."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from pipeline.config.evaluate import EvaluateConfig
from pipeline.evaluation.benchmarks import Benchmark


def problems_digest(benchmarks: Sequence[Benchmark]) -> str:
    """sha256 (16 hex digits) over every evaluated problem: benchmark, id, question, accepted answers."""
    digest = hashlib.sha256()
    for bench in benchmarks:
        for p in bench.problems:
            digest.update(json.dumps([bench.name, p.id, p.question, list(p.answers)]).encode() + b"\n")
    return digest.hexdigest()[:16]


def evaluation_setting(ec: EvaluateConfig, protocol: str, benchmarks: Sequence[Benchmark]) -> dict[str, str]:
    """The setting an evaluation's accuracy is comparable within (flat strings: MLflow tags): the problems, the
    evaluate section's samples, temperature and mode, and the rollout's protocol."""
    return {"split": ",".join(b.name for b in benchmarks), "problems_sha256": problems_digest(benchmarks),
            "problems": str(sum(len(b.problems) for b in benchmarks)), "samples": str(ec.samples),
            "temperature": repr(float(ec.temperature)), "protocol": protocol, "mode": ec.mode}
