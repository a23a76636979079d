"""Tool-service outages during training: what is never trained on, and when a run stops.

A tool call whose service failed (`ToolResult.infrastructure`: refused, 5xx/429, garbage, no
answer in time) put an outage message where the policy expected a tool's answer. Training on it
would teach the policy that the tool is broken, so:

1. A group with any such trajectory is dropped from the batch (not only the trajectory: the
   group-relative baseline of the remaining ones would be biased towards the trajectories that
   did not call the broken tool), and counted (`train/outage_dropped_groups`). Dynamic sampling
   replaces it as it replaces an uninformative group.
2. Per service, the share of the step's calls that failed so is checked against
   `train.outages.max_step_share`, and the share over the run so far against
   `train.outages.max_run_share`; past either, the step raises `ToolOutage` naming the service,
   before its batch is trained on. A dead service fails the run; a blip the services flow
   recovers from costs a few dropped groups.

GRPO/DAPO have no such rule: their tools (if any) are assumed up.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from pipeline.types import ScoredGroup, Trajectory


class ToolOutage(RuntimeError):
    """Too many of a tool service's calls failed for infrastructure reasons; names the service."""


def has_outage(group: ScoredGroup) -> bool:
    """True when any trajectory of the group read an outage instead of a tool's answer."""
    return any(t.infrastructure_failures for t in group.group.trajectories)


@dataclass
class OutageCounts:
    """Tool calls per service, the infrastructure failures among them, and one such error each."""

    calls: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    example: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, trajectories: Iterable[Trajectory]) -> OutageCounts:
        counts = cls()
        for t in trajectories:
            for call in t.tool_calls:
                counts.calls[call.tool] += 1
                if call.result.infrastructure:
                    counts.failures[call.tool] += 1
                    counts.example.setdefault(call.tool, call.result.error or call.result.output)
        return counts

    def add(self, other: OutageCounts) -> None:
        self.calls.update(other.calls)
        self.failures.update(other.failures)
        for tool, error in other.example.items():
            self.example[tool] = error

    def share(self, tool: str) -> float:
        return self.failures[tool] / self.calls[tool] if self.calls[tool] else 0.0

    def over(self, limit: float) -> list[str]:
        """The services whose share of failed calls is above `limit` (any failure counts at limit 0)."""
        return sorted(t for t in self.calls if self.failures[t] and self.share(t) > limit)


@dataclass
class OutageGuard:
    """Checks each step's rollout, and the run's so far; raises before a step trains on an outage."""

    max_step_share: float
    max_run_share: float
    run: OutageCounts = field(default_factory=OutageCounts)

    def check(self, seen: list[ScoredGroup], step_label: str = "this step") -> dict[str, float]:
        """The step's outage metrics; raises `ToolOutage` when a service is past either limit."""
        step = OutageCounts.of(t for g in seen for t in g.group.trajectories)
        self.run.add(step)
        for counts, limit, scope in ((step, self.max_step_share, step_label), (self.run, self.max_run_share, "the run")):
            for tool in counts.over(limit):
                raise ToolOutage(
                    f"tool service {tool!r} is failing: {counts.failures[tool]} of its {counts.calls[tool]} calls in "
                    f"{scope} failed for infrastructure reasons ({counts.share(tool):.0%}, limit {limit:.0%}; "
                    f"e.g. {counts.example[tool][:300]!r}); stopped before training on them")
        dropped = sum(has_outage(g) for g in seen)
        return {f"tool_outages/{tool}": float(step.failures[tool]) for tool in step.calls} | {
            "train/outage_dropped_groups": float(dropped)}
