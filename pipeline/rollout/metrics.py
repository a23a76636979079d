"""Per-batch rollout statistics: tool use, latency, generator utilisation, finish reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from pipeline.protocols import MALFORMED
from pipeline.rollout.backends.decoding import DecoderStats
from pipeline.types import Group, ToolName, ToolResult


@dataclass(frozen=True)
class RolloutStats:
    trajectories: int
    wall_s: float
    generator_busy_s: float
    generator_idle_s: float
    policy_tokens: int
    calls_per_trajectory: dict[str, float] = field(default_factory=dict)  # tool -> mean calls
    tool_errors: dict[str, int] = field(default_factory=dict)  # tool -> failed calls
    tool_latency_p50_s: dict[str, float] = field(default_factory=dict)
    tool_latency_p95_s: dict[str, float] = field(default_factory=dict)
    turns_histogram: dict[int, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    prefill_tokens: int = 0  # context tokens fed at admission (prompts, tool outputs)
    reused_tokens: int = 0  # context tokens a re-admitted sequence took from its parked KV cache
    tool_seconds: dict[str, float] = field(default_factory=dict)  # tool -> summed call latency (calls overlap)
    # The hf decoder's batched decoding steps and the rows they sampled (vLLM counts no steps: then no
    # rows-per-step figure): few rows a step means the rollout waits on its longest rows, not on throughput.
    decode_steps: int = 0
    decode_rows: int = 0
    malformed_calls: int = 0  # calls a chat-template protocol could not read or whose schema refused them

    @property
    def idle_fraction(self) -> float:
        total = self.generator_busy_s + self.generator_idle_s
        return self.generator_idle_s / total if total > 0 else 0.0

    @classmethod
    def collect(cls, groups: list[Group], decoder: DecoderStats, results: list[tuple[ToolName, ToolResult]],
                wall_s: float) -> RolloutStats:
        trajs = [t for g in groups for t in g.trajectories]
        tools = sorted({name for name, _ in results} | {c.tool for t in trajs for c in t.tool_calls})
        latencies = {name: [r.latency_s for n, r in results if n == name] for name in tools}
        return cls(
            trajectories=len(trajs),
            wall_s=wall_s,
            generator_busy_s=decoder.busy_s,
            generator_idle_s=decoder.idle_s,
            policy_tokens=sum(t.policy_token_count for t in trajs),
            calls_per_trajectory={n: float(np.mean([t.calls_of(n) for t in trajs])) if trajs else 0.0 for n in tools},
            tool_errors={n: sum(1 for t in trajs for c in t.tool_calls if c.tool == n and not c.result.ok) for n in tools},
            tool_latency_p50_s={n: float(np.percentile(v, 50)) for n, v in latencies.items() if v},
            tool_latency_p95_s={n: float(np.percentile(v, 95)) for n, v in latencies.items() if v},
            turns_histogram=dict(sorted(Counter(t.turns for t in trajs).items())),
            finish_reasons=dict(sorted(Counter(t.finish_reason for t in trajs).items())),
            prefill_tokens=decoder.prefill_tokens,
            reused_tokens=decoder.reused_tokens,
            tool_seconds={n: float(sum(v)) for n, v in latencies.items()},
            decode_steps=decoder.steps,
            decode_rows=decoder.sampled_tokens,
            malformed_calls=sum(c.result.status == MALFORMED for t in trajs for c in t.tool_calls),
        )

    @classmethod
    def merge(cls, parts: list[RolloutStats]) -> RolloutStats:
        """Several rollout rounds of one step as one: counts and times add, rates are trajectory-weighted."""
        n = sum(p.trajectories for p in parts)

        def weighted(field_name: str) -> dict[str, float]:
            keys = {k for p in parts for k in getattr(p, field_name)}
            return {k: sum(getattr(p, field_name).get(k, 0.0) * p.trajectories for p in parts) / max(n, 1) for k in keys}

        def added(field_name: str) -> dict:
            out: Counter = Counter()
            for p in parts:
                out.update(getattr(p, field_name))
            return dict(sorted(out.items()))

        return cls(
            trajectories=n,
            wall_s=sum(p.wall_s for p in parts),
            generator_busy_s=sum(p.generator_busy_s for p in parts),
            generator_idle_s=sum(p.generator_idle_s for p in parts),
            policy_tokens=sum(p.policy_tokens for p in parts),
            calls_per_trajectory=weighted("calls_per_trajectory"),
            tool_errors=added("tool_errors"),
            tool_latency_p50_s=weighted("tool_latency_p50_s"),
            tool_latency_p95_s=weighted("tool_latency_p95_s"),
            turns_histogram=added("turns_histogram"),
            finish_reasons=added("finish_reasons"),
            prefill_tokens=sum(p.prefill_tokens for p in parts),
            reused_tokens=sum(p.reused_tokens for p in parts),
            tool_seconds=added("tool_seconds"),
            decode_steps=sum(p.decode_steps for p in parts),
            decode_rows=sum(p.decode_rows for p in parts),
            malformed_calls=sum(p.malformed_calls for p in parts),
        )

    def as_metrics(self, prefix: str = "rollout/") -> dict[str, float]:
        """Flat name -> value for MLflow and metrics files."""
        out = {
            "trajectories": self.trajectories,
            "wall_s": self.wall_s,
            "generator_idle_fraction": self.idle_fraction,
            "policy_tokens_per_s": self.policy_tokens / self.wall_s if self.wall_s > 0 else 0.0,
            "mean_policy_tokens": self.policy_tokens / max(self.trajectories, 1),
            "prefill_tokens": self.prefill_tokens,
            "reused_kv_tokens": self.reused_tokens,
            "malformed_calls": self.malformed_calls,
        }
        if self.decode_steps:
            out |= {"decode_steps": self.decode_steps, "rows_per_decode_step": self.decode_rows / self.decode_steps}
        out |= {f"calls_per_traj/{k}": v for k, v in self.calls_per_trajectory.items()}
        out |= {f"tool_errors/{k}": v for k, v in self.tool_errors.items()}
        out |= {f"tool_latency_p50_s/{k}": v for k, v in self.tool_latency_p50_s.items()}
        out |= {f"tool_latency_p95_s/{k}": v for k, v in self.tool_latency_p95_s.items()}
        out |= {f"tool_seconds/{k}": v for k, v in self.tool_seconds.items()}
        out |= {f"turns/{k}": v for k, v in self.turns_histogram.items()}
        out |= {f"finish/{k}": v for k, v in self.finish_reasons.items()}
        return {prefix + k: float(v) for k, v in out.items()}
