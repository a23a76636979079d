"""The weight push: after an optimiser step the trainer's weights reach every server, which keeps its requests.

One push, on every READY (or STALE) server of the pool, each phase on all servers at once:

1. prepare (the servers still generate): the weights are checked against the layout of the checkpoint the servers
   started from (names and shapes: a failed reload can leave a server unable to reload until restarted) and, with
   the file transport, written;
2. pause with mode keep (`POST /pause?mode=keep`): requests in flight are frozen with their tokens and KV;
3. load (the file transport: `POST /collective_rpc tapo_load_file [path, version]` on our worker extension, which
   reloads the model in place with vLLM's `reload_weights`; NCCL: pipeline.inference.nccl);
4. set the version (`POST /update_weight_version`): tokens sampled from now on carry it in `weight_versions`;
5. resume (`POST /resume`): the frozen requests continue on the new weights.

Every phase is timed (`PushReport`). A server that fails a phase is marked dead: its keeper restarts it and, with
the file transport, loads the file this push wrote before routing to it again (the pool keeps the current version
and file). A push the servers refuse (their receivers found the file is not the checkpoint's layout) resumes them on
their old weights and raises `control.WeightsRefused`.

Departure from vLLM's NCCL examples and TRL: those pause with mode abort or wait; keep is what makes rollouts
partial (PipelineRL and NeMo-RL moved to it), and the caller reads the spans to know which tokens each version
sampled.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import save_file

from pipeline.inference import control
from pipeline.inference.layout import Layout, check_layout, from_json
from pipeline.inference.pool import ServerPool
from pipeline.inference.receiver import VERSION_KEY
from pipeline.inference.server import Server, ServerState


@dataclass(frozen=True)
class WeightSource:
    """What a push sends: the tensors' names and shapes known up front (a ZeRO-3 parameter's full shape is known
    without gathering it) and an iterator that yields each full tensor, valid until it advances."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, torch.dtype]
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]

    @classmethod
    def of_module(cls, module: torch.nn.Module) -> WeightSource:
        """A module whose parameters are whole (one process, ZeRO-0/2); tied ones once, as named_parameters does."""
        named = list(module.named_parameters())
        return cls({n: tuple(p.shape) for n, p in named}, {n: p.dtype for n, p in named},
                   lambda: ((n, p.detach()) for n, p in module.named_parameters()))

    @classmethod
    def of_tensors(cls, tensors: dict[str, torch.Tensor]) -> WeightSource:
        return cls({n: tuple(t.shape) for n, t in tensors.items()}, {n: t.dtype for n, t in tensors.items()},
                   lambda: iter(tensors.items()))

    @property
    def nbytes(self) -> int:
        return sum(int(torch.Size(s).numel()) * self.dtypes[n].itemsize for n, s in self.shapes.items())


class Transport(Protocol):
    def prepare(self, source: WeightSource, version: int, layout: Layout) -> Path | None:
        """Everything that can happen while the servers still generate; the file that holds the weights, if any."""

    def load(self, servers: list[Server], source: WeightSource, version: int, prepared: Path | None) -> dict[str, str]:
        """Load the weights into the paused `servers`; per server name, why it failed (absent: loaded)."""

    def finish(self, prepared: Path | None) -> None:
        """The push is over (the pool now catches restarted servers up from `prepared`)."""

    def discard(self, prepared: Path | None) -> None:
        """The push was refused: what `prepare` made is not kept."""


@dataclass
class PushReport:
    """One push, timed per phase (seconds: the slowest server's)."""

    version: int
    bytes: int
    prepare_s: float = 0.0
    pause_s: float = 0.0
    load_s: float = 0.0
    version_s: float = 0.0
    resume_s: float = 0.0
    total_s: float = 0.0
    loaded: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def as_metrics(self, prefix: str = "push/") -> dict[str, float]:
        phases = ("prepare_s", "pause_s", "load_s", "version_s", "resume_s", "total_s")
        return {f"{prefix}{k}": float(getattr(self, k)) for k in phases} | {
            f"{prefix}servers_failed": float(len(self.failed)), f"{prefix}mbytes": self.bytes / 2**20}


class FileTransport:
    """CPU servers (or any that share a file system with the trainer): one safetensors file of the whole model, in
    `directory` (/dev/shm by default: memory, not disk), loaded by every server's receiver."""

    def __init__(self, directory: Path, deadline_s: float) -> None:
        self.directory, self.deadline_s = Path(directory), deadline_s
        self._previous: Path | None = None
        sweep_stale_files(self.directory)

    def prepare(self, source: WeightSource, version: int, layout: Layout) -> Path:
        check_layout(layout, source.shapes)
        tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in source.tensors()}
        check_layout(layout, {n: tuple(t.shape) for n, t in tensors.items()})  # what the iterator really gave
        path = self.directory / f"tapo-weights-{os.getpid()}-{id(self)}-v{version}.safetensors"
        partial = path.with_suffix(".partial")
        try:
            save_file(tensors, str(partial), metadata={VERSION_KEY: str(version)})
            os.replace(partial, path)  # a server never reads a half-written file
        finally:
            partial.unlink(missing_ok=True)
        return path

    def load(self, servers: list[Server], source: WeightSource, version: int, prepared: Path | None) -> dict[str, str]:
        return on_all(servers, lambda s: control.load_file(s.url, str(prepared), version, self.deadline_s))

    def finish(self, prepared: Path | None) -> None:
        if self._previous is not None and self._previous != prepared:
            self._previous.unlink(missing_ok=True)
        self._previous = prepared

    def discard(self, prepared: Path | None) -> None:
        if prepared is not None and prepared != self._previous:
            prepared.unlink(missing_ok=True)

    def close(self) -> None:
        if self._previous is not None:
            self._previous.unlink(missing_ok=True)


def sweep_stale_files(directory: Path) -> list[Path]:
    """Remove the weight files of trainers that are gone (a SIGKILLed one cannot remove its own; in /dev/shm a file
    holds memory until it is removed). The writer's pid is in the name; a live pid keeps its files."""
    removed = []
    for path in Path(directory).glob("tapo-weights-*-*-v*"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not _running(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def on_all(servers: Iterable[Server], fn: Callable[[Server], object]) -> dict[str, str]:
    """`fn` on every server at once; per server name, why it failed (absent: it succeeded)."""
    servers = list(servers)
    if not servers:
        return {}
    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        futures = {s.name: pool.submit(fn, s) for s in servers}
    failed = {}
    for name, future in futures.items():
        err = future.exception()
        if err is not None:
            failed[name] = f"{type(err).__name__}: {err}"
            if isinstance(err, control.WeightsRefused):
                raise err
    return failed


class WeightPusher:
    """Pushes the trainer's weights to every server of `pool` (see the module). One push at a time."""

    def __init__(self, pool: ServerPool, transport: Transport, *, control_deadline_s: float) -> None:
        self.pool, self.transport, self.deadline_s = pool, transport, control_deadline_s
        self._layout: Layout | None = None
        self._lock = threading.Lock()

    def layout(self) -> Layout:
        """The served checkpoint's layout, as a server's receiver reads it (asked once)."""
        if self._layout is None:
            server = next(iter(self.pool.ready()), None)
            if server is None:
                raise RuntimeError("no inference server is up to ask for the checkpoint's layout")
            self._layout = from_json(control.collective_rpc(server.url, "tapo_layout", [], self.deadline_s)[0])
        return self._layout

    def push(self, source: WeightSource, version: int) -> PushReport:
        with self._lock:
            report, start = PushReport(version, source.nbytes), time.perf_counter()
            prepared = self._timed(report, "prepare_s", lambda: self.transport.prepare(source, version, self.layout()))
            targets = [s for s in self.pool.servers if s.state in (ServerState.READY, ServerState.STALE)]
            targets = self._phase(report, "pause_s", targets, lambda s: control.pause(s.url, self.deadline_s))
            before = self.pool.current()
            self.pool.loaded(version, prepared)  # a server restarted from here on catches up to this version
            try:
                failed = self._timed(report, "load_s", lambda: self.transport.load(targets, source, version, prepared))
            except control.WeightsRefused:
                self.pool.loaded(*before)
                self.transport.discard(prepared)
                on_all(targets, lambda s: control.resume(s.url, self.deadline_s))
                raise
            self._dead(report, failed)
            targets = [s for s in targets if s.name not in failed]
            targets = self._phase(report, "version_s", targets,
                                  lambda s: control.set_version(s.url, version, self.deadline_s))
            targets = self._phase(report, "resume_s", targets, lambda s: _resumed(s, version, self.deadline_s))
            report.loaded = [s.name for s in targets]
            self.transport.finish(prepared)
            report.total_s = time.perf_counter() - start
            return report

    def _phase(self, report: PushReport, phase: str, servers: list[Server],
               fn: Callable[[Server], object]) -> list[Server]:
        failed = self._timed(report, phase, lambda: on_all(servers, fn))
        self._dead(report, failed)
        return [s for s in servers if s.name not in failed]

    @staticmethod
    def _timed(report: PushReport, phase: str, fn: Callable[[], object]):
        start = time.perf_counter()
        try:
            return fn()
        finally:
            setattr(report, phase, time.perf_counter() - start)

    def _dead(self, report: PushReport, failed: dict[str, str]) -> None:
        for server in self.pool.servers:
            if server.name in failed:
                report.failed[server.name] = failed[server.name]
                server.mark_dead(f"weight push {report.version}: {failed[server.name]}")


def _resumed(server: Server, version: int, deadline_s: float) -> None:
    control.resume(server.url, deadline_s)
    server.version = version
    if server.state is ServerState.STALE:
        server.state = ServerState.READY
