"""The code-interpreter service."""

from __future__ import annotations

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig


class SandboxConfig(StageConfig):
    url: str = Field("", description="Use an already running sandbox at this URL; empty = the services flow starts one.")
    port: int = Field(0, ge=0, le=65535, description="Port for a started sandbox (0 = any free port).")
    workers: int = Field(2, ge=1, le=64, description="Pre-warmed worker processes (per training rank: the train "
                                                    "stage starts a sandbox for N ranks with N x workers).")
    timeout_s: float = Field(5.0, gt=0.0, le=60.0, description="Wall-clock limit per snippet.")
    memory_mb: int = Field(512, ge=32, le=8192, description="Memory a snippet may allocate on top of the pre-warmed worker.")
    queue_size: int = Field(256, ge=1, le=100_000, description="Requests a started sandbox lets wait before answering "
                                                               "429 (per training rank, like workers).")
    max_timeout_s: float = Field(10.0, gt=0.0, le=300.0, description="Server-side cap on any request's timeout_s.")
    max_memory_mb: int = Field(2048, ge=32, le=65536, description="Server-side cap on any request's memory_mb.")
    concurrency: int = Field(8, ge=1, le=1024, description="Client: requests in flight at once; more wait in the client.")
    retries: int = Field(2, ge=0, le=10, description="Client: retries after connection errors and 429/502/503/504.")
    seed: int | None = Field(0, ge=0, description=(
        "Client: a snippet's random generators (random, numpy's global one, sympy's) start from a seed made of this "
        "and its code, so the same call prints the same thing in every run (a repeated run repeats its tool "
        "answers); null = fresh randomness per snippet, as SandboxFusion."))
    recover_s: float = Field(20.0, ge=0.0, le=600.0, description=(
        "Client: keep retrying a refused connection this long (a sandbox the services flow is restarting) before "
        "the call counts as an outage; 0 = no waiting."))
    deadline_s: float = Field(60.0, gt=0.0, le=3600.0, description=(
        "Client: the deadline of a whole call (retries and the wait for a restarting sandbox included); no complete "
        "answer by then is an outage. At least timeout_s + recover_s."))
    max_answer_bytes: int = Field(1 << 20, ge=1024, le=1 << 30, description=(
        "Client: an answer longer than this is not read; it can only be the snippet's output (the sandbox caps it at "
        "64 KiB a stream), so the call is the policy's 'output_limit'."))

    @model_validator(mode="after")
    def _deadline_holds_a_call(self) -> SandboxConfig:
        if self.deadline_s < self.timeout_s + self.recover_s:
            raise ValueError(f"sandbox.deadline_s ({self.deadline_s:g}) must be at least sandbox.timeout_s + "
                             f"sandbox.recover_s ({self.timeout_s + self.recover_s:g}): a call may run its snippet "
                             "after waiting out a restart")
        return self

    def server_args(self, ranks: int = 1) -> list[str]:
        """Command-line arguments for `python -m sandbox.code` (besides --host/--port), for a sandbox that serves
        `ranks` training ranks, each with its own rollout engine calling it: workers and queue scale with them."""
        return ["--workers", str(self.workers * ranks), "--queue-size", str(self.queue_size * ranks),
                "--max-timeout-s", str(self.max_timeout_s), "--max-memory-mb", str(self.max_memory_mb)]
