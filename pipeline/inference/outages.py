"""Inference-server outages: counted like a tool service's (pipeline.tools.outages), so a dead server stops a run
loudly instead of silently starving it.

A generate attempt that a server failed (no connection, the connection dropped mid-request, a 5xx or 429, an answer
that is not the protocol's, no answer within the deadline) is counted against that server, and the request is
retried on another server (or on the same one once it has been restarted). A request that no attempt completed is
a failed generation: its trajectory cannot go on, and the caller drops its group as it drops a group that read a
tool outage. Per server, the share of failed attempts in a step and over the run is checked against two limits, as
`train.outages.max_step_share` and `train.outages.max_run_share` are for tools; past either, `InferenceOutage` names
the server and the last error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


class InferenceOutage(RuntimeError):
    """Too many of a server's generate attempts failed; names the server."""


@dataclass
class ServerCounts:
    """Generate attempts per server, the failed ones, one error each, and requests that no attempt completed."""

    attempts: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    example: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    failed_requests: int = 0
    last_failed_request: str = ""

    def attempt(self, server: str) -> None:
        self.attempts[server] += 1

    def failure(self, server: str, error: str) -> None:
        self.failures[server] += 1
        self.example[server] = error

    def add(self, other: ServerCounts) -> None:
        self.attempts.update(other.attempts)
        self.failures.update(other.failures)
        self.example.update(other.example)
        self.requests += other.requests
        self.failed_requests += other.failed_requests
        self.last_failed_request = other.last_failed_request or self.last_failed_request

    def share(self, server: str) -> float:
        return self.failures[server] / self.attempts[server] if self.attempts[server] else 0.0

    def over(self, limit: float) -> list[str]:
        return sorted(s for s in self.attempts if self.failures[s] and self.share(s) > limit)

    def request_share(self) -> float:
        return self.failed_requests / self.requests if self.requests else 0.0


@dataclass
class ServerOutageGuard:
    """Reads the counts of each step (`step`, then reset) and of the run; raises past either limit."""

    max_step_share: float
    max_run_share: float
    step: ServerCounts = field(default_factory=ServerCounts)
    run: ServerCounts = field(default_factory=ServerCounts)

    def check(self, step_label: str = "this step") -> dict[str, float]:
        """The step's metrics; raises `InferenceOutage` when a server is past a limit. Starts the next step's counts."""
        step, self.step = self.step, ServerCounts()
        self.run.add(step)
        for counts, limit, scope in ((step, self.max_step_share, step_label), (self.run, self.max_run_share, "the run")):
            for server in counts.over(limit):
                raise InferenceOutage(
                    f"inference server {server!r} is failing: {counts.failures[server]} of its "
                    f"{counts.attempts[server]} generate attempts in {scope} failed ({counts.share(server):.0%}, "
                    f"limit {limit:.0%}; e.g. {counts.example[server][:300]!r})")
            if counts.failed_requests and counts.request_share() > limit:  # no server could take them at all
                raise InferenceOutage(
                    f"{counts.failed_requests} of {counts.requests} generate requests in {scope} failed on every "
                    f"server they were sent to or found none up ({counts.request_share():.0%}, limit {limit:.0%}; "
                    f"e.g. {counts.last_failed_request[:300]!r})")
        return {f"inference_outages/{s}": float(step.failures[s]) for s in step.attempts} | {
            "inference/failed_attempts": float(sum(step.failures.values())),
            "inference/failed_requests": float(step.failed_requests)}
