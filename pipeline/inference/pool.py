"""The inference servers of a run: started here (each on its cores or GPUs) or given by URL, kept up by one keeper
thread each, and brought to the current weights whenever one (re)joins.

`ServerPool.start()` waits, with a deadline, until every server answers and holds the current weights; `close()`
(also on any exception, and by the context manager) stops every keeper, each ending its server's whole process
group, in parallel. What the pool knows about the weights is the current version and, with the file transport, the
file that holds them: a server that comes back after a restart loads that file before it is routed to again; with
the NCCL transport it cannot load by itself and waits, unrouted (STALE), for the next push.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.inference import InferenceConfig
from pipeline.inference import control
from pipeline.inference.keeper import Keeper
from pipeline.inference.server import (LaunchSpec, Log, Server, ServerProcess, ServerState, server_process,
                                      stderr_log)
from pipeline.services.processes import free_port


@dataclass(frozen=True)
class Supervision:
    """How keepers watch and restart (pipeline.config.inference)."""

    start_timeout_s: float = 600.0
    max_restarts: int = 3
    interval_s: float = 2.0
    unhealthy_polls: int = 15
    control_deadline_s: float = 120.0
    load_deadline_s: float = 900.0


class ServerPool:
    """The servers, their keepers, and the weights every server must hold before it is routed to."""

    def __init__(self, servers: Sequence[Server], keepers: Sequence[Keeper], supervision: Supervision) -> None:
        self.servers, self.keepers, self.supervision = list(servers), list(keepers), supervision
        self.version = 0
        self.weights_file: Path | None = None
        self.transport = "file"
        self._weights = threading.Lock()

    @classmethod
    def launched(cls, specs: Sequence[LaunchSpec], supervision: Supervision, log: Log = stderr_log) -> ServerPool:
        return cls.of_processes([server_process(spec) for spec in specs], supervision, log)

    @classmethod
    def of_processes(cls, processes: Sequence[ServerProcess], supervision: Supervision,
                     log: Log = stderr_log) -> ServerPool:
        """Servers started by these processes (a vLLM server's, `server_process`; or any that speaks its routes)."""
        servers = [Server(p.name, p.url, launched=True) for p in processes]
        return cls._with_keepers(servers, list(processes), supervision, log)

    @classmethod
    def external(cls, urls: Sequence[str], supervision: Supervision, log: Log = stderr_log) -> ServerPool:
        servers = [Server(f"server-{i}", url.rstrip("/"), launched=False) for i, url in enumerate(urls)]
        return cls._with_keepers(servers, [None] * len(servers), supervision, log)

    @classmethod
    def from_config(cls, cfg: InferenceConfig, model_dir: Path, log_dir: Path, seed: int = 0,
                    log: Log = stderr_log) -> ServerPool:
        launch = cfg.launch
        supervision = Supervision(launch.start_timeout_s if launch else 600.0, launch.max_restarts if launch else 0,
                                  cfg.health_interval_s, cfg.unhealthy_polls, cfg.control_deadline_s,
                                  cfg.load_deadline_s)
        if launch is None:
            pool = cls.external(cfg.urls, supervision, log)
        else:
            specs = [LaunchSpec(f"vllm-{i}", model_dir, free_port(), log_dir, python=launch.python,
                                cores=launch.cores[i] if launch.cores else (), gpus=launch.gpus[i] if launch.gpus else (),
                                max_model_len=launch.max_model_len, kv_cache_gib=launch.kv_cache_gib,
                                gpu_memory_utilization=launch.gpu_memory_utilization, dtype=launch.dtype,
                                logprobs_mode=launch.logprobs_mode, seed=seed + i,
                                nccl=cfg.weight_transport == "nccl", extra_args=launch.extra_args)
                     for i in range(launch.count)]
            pool = cls.launched(specs, supervision, log)
        pool.transport = cfg.weight_transport
        return pool

    @classmethod
    def _with_keepers(cls, servers: list[Server], processes: list, supervision: Supervision, log: Log) -> ServerPool:
        pool = cls(servers, [], supervision)
        pool.keepers = [Keeper(s, p, catch_up=pool.catch_up, log=log, start_timeout_s=supervision.start_timeout_s,
                               max_restarts=supervision.max_restarts, interval_s=supervision.interval_s,
                               unhealthy_polls=supervision.unhealthy_polls) for s, p in zip(servers, processes)]
        return pool

    def start(self, timeout_s: float | None = None) -> ServerPool:
        """Start every keeper and wait until every server is READY; on a deadline or a failed server, close the pool
        and raise naming the servers that are not ready."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else
                                       self.supervision.start_timeout_s * (self.supervision.max_restarts + 1))
        for keeper in self.keepers:
            keeper.start()
        try:
            while not all(s.state is ServerState.READY for s in self.servers):
                failed = [s for s in self.servers if s.state is ServerState.FAILED]
                if failed or time.monotonic() > deadline:
                    waiting = [f"{s.name} at {s.url}: {s.state.value} ({s.last_error})" for s in self.servers
                               if s.state is not ServerState.READY]
                    raise TimeoutError("inference servers not ready: " + "; ".join(waiting))
                time.sleep(0.2)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every keeper at once (each ends its server's process group); idempotent."""
        for keeper in self.keepers:
            keeper.stopping.set()
        for keeper in self.keepers:
            if keeper.is_alive():
                keeper.join(60.0)

    def __enter__(self) -> ServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ready(self) -> list[Server]:
        return [s for s in self.servers if s.state is ServerState.READY]

    def loaded(self, version: int, weights_file: Path | None) -> None:
        """A push made `version` current (held in `weights_file` with the file transport): servers that (re)join
        from now on catch up to it."""
        with self._weights:
            self.version, self.weights_file = version, weights_file

    def current(self) -> tuple[int, Path | None]:
        with self._weights:
            return self.version, self.weights_file

    def catch_up(self, server: Server) -> None:
        """Bring a server that just came up to the current weights (its keeper calls this before routing to it). A
        push that makes a newer version current meanwhile is followed: the loop ends on the version still current."""
        while True:
            version, path = self.current()
            if path is None:
                break
            try:
                control.load_file(server.url, str(path), version, self.supervision.load_deadline_s)
            except control.WeightsRefused:
                if self.current()[0] == version:  # not a file replaced under us: the push is wrong
                    raise
                continue
            if self.current()[0] == version:
                break
        if path is None and version > 0:  # NCCL: the checkpoint's weights until the next push reaches it
            version = 0
            server.state = ServerState.STALE
        control.set_version(server.url, version, self.supervision.control_deadline_s)
        server.version = version
