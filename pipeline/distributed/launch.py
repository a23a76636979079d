"""Start the ranks of a data-parallel run with an existing launcher, stream their output, leave nothing behind.

`distributed` in params says where ranks run (`placement`): `nproc_per_node` (auto = the visible CUDA GPUs, 1
without one), `nnodes`, and the launcher: `torchrun` on one node, or DeepSpeed's launcher, which starts the
ranks of every node of a `hostfile` over ssh (pdsh). `run_ranks` starts the launcher as a child process and

* streams every line the ranks print (torchrun prefixes each with `[rank<N>]:`; pdsh with the host) to a
  callback, so the train stage's flow logs them, and keeps each rank's whole log in `log_dir` (torchrun);
* fails when any rank fails: the launcher stops the other ranks (torchrun `--max-restarts 0`; a rank
  blocked in a collective would otherwise wait forever) and exits non-zero;
* leaves no process behind: the launcher and everything under it carry a tag of this launch in their
  environment (`pipeline.services.reaper.tagged`), and once the launcher has exited (also after a SIGKILL of
  the launcher, whose ranks nobody else would stop: torchrun starts each in a session of its own, and they are
  re-parented to init) every process still carrying the tag is ended, wherever it now sits; it stops the
  launcher when the caller is interrupted. A rank also dies with its launcher (`die_with_launcher`).

Why torchrun and no launcher of our own: it does what ours did (loopback rendezvous on a free port, one
exit status, every rank stopped when one fails, OMP threads) and also tees each rank's output into its own
file with a rank prefix. What it cannot do is start ranks on other machines from this one; DeepSpeed's
launcher can (one ssh per node), so a hostfile takes it.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch.distributed as dist

from pipeline.config.distributed import DistributedConfig
from pipeline.model import visible_gpus
from pipeline.services.processes import PR_SET_PDEATHSIG, LOOPBACK, free_port, parent_death_signal
from pipeline.services.reaper import descendants, end_all, new_tag, tagged, with_tag

POLL_S = 0.25
STOP_GRACE_S = 15  # the launcher's own grace for its ranks (SIGTERM, then SIGKILL)
RANK_PREFIX = "[rank${rank}]:"  # torchrun's template for the lines it tees
TAIL_LINES = 40


@dataclass(frozen=True)
class RankLayout:
    """Where the ranks run; resolved once from `distributed` (`rank_layout`)."""

    nproc_per_node: int | None  # None: every slot of each hostfile node
    nnodes: int
    launcher: Literal["torchrun", "deepspeed"]
    hostfile: Path | None
    master_addr: str
    python: str = sys.executable  # the interpreter of the launcher and the ranks

    @property
    def local_ranks(self) -> int:
        """Ranks on this node (what services started here serve)."""
        return self.nproc_per_node or 1


def on_this_machine(nproc: int) -> RankLayout:
    """`nproc` ranks on this machine, started by torchrun (benchmarks, tests)."""
    return RankLayout(nproc, 1, "torchrun", None, "")


def rank_layout(cfg: DistributedConfig) -> RankLayout:
    """`nproc_per_node: auto` resolved on this machine: its visible GPUs, or 1 rank on a machine without one
    (with a hostfile, auto leaves the count to each node's slots)."""
    hostfile = Path(cfg.hostfile).resolve() if cfg.hostfile else None
    if hostfile is not None and not hostfile.is_file():
        raise FileNotFoundError(f"distributed.hostfile: {hostfile} does not exist")
    python = os.path.abspath(cfg.python) if cfg.python else sys.executable  # not resolved: a venv's python is a link
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise FileNotFoundError(f"distributed.python: {python} is no executable (for .venv-vllm/bin/python: "
                                "scripts/setup_vllm.sh builds it)")
    return RankLayout(cfg.ranks_per_node(visible_gpus()), cfg.nnodes, cfg.launcher, hostfile, cfg.master_addr, python)


def lacking(python: str, modules: Sequence[str]) -> list[str]:
    """Which of `modules` the environment of `python` cannot import (checked without importing them)."""
    probe = "import importlib.util, sys; print('lacks:', *(m for m in sys.argv[1:] if not importlib.util.find_spec(m)))"
    found = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=120)
    answer = found.stdout.split()
    if found.returncode != 0 or answer[:1] != ["lacks:"]:  # e.g. an executable that is no Python and says nothing
        raise RuntimeError(f"{python} could not be asked for its modules (is it a Python interpreter?): "
                           f"{(found.stderr or found.stdout).strip()[-500:]}")
    return answer[1:]


def launcher_command(p: RankLayout, program: Sequence[str], *, port: int, log_dir: Path) -> list[str]:
    """The command that starts `program` (what follows `python` for one rank: `-m module args` or
    `script args`) on every rank of `p`, with `p.python` (the launchers start the ranks with their own)."""
    python, module = p.python, program[:1] == ["-m"]
    target = list(program[1:] if module else program)
    if p.launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
                "--nproc-per-node", str(p.local_ranks), "--master-addr", p.master_addr or LOOPBACK,
                "--master-port", str(port), "--max-restarts", "0", "--log-dir", str(log_dir), "--tee", "3",
                *(["-m"] if module else []), *target]
    command = [python, "-m", "deepspeed.launcher.runner", "--master_port", str(port), "--no_local_rank"]
    if p.hostfile is not None:
        command += ["--hostfile", str(p.hostfile), "--num_nodes", str(p.nnodes)]
    if p.nproc_per_node is not None:
        command += ["--num_gpus", str(p.nproc_per_node)]
    if p.master_addr:
        command += ["--master_addr", p.master_addr]
    return [*command, *(["--module"] if module else []), *target]


@dataclass(frozen=True)
class RanksResult:
    returncode: int  # the launcher's: 0 when every rank succeeded
    tail: str  # its last lines (the failing rank's error and the launcher's summary on failure)
    log_dir: Path


def rank_env(base: Mapping[str, str]) -> dict[str, str]:
    """The ranks' environment: unbuffered output, so their lines reach the log as they are printed."""
    return dict(base) | {"PYTHONUNBUFFERED": "1", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX}


def run_ranks(program: Sequence[str], p: RankLayout, *, log_dir: Path, env: Mapping[str, str] | None = None,
              on_line: Callable[[str], None] = print, timeout_s: float | None = None) -> RanksResult:
    """Run `program` on every rank of `p` and wait (see the module). A `timeout_s` that runs out stops the ranks
    and returns the launcher's status then (non-zero)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    command = launcher_command(p, program, port=free_port(), log_dir=log_dir)
    tag = new_tag()
    launcher = subprocess.Popen(command, env=with_tag(rank_env(os.environ if env is None else env), tag),
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True, preexec_fn=parent_death_signal())
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=_stream, args=(launcher, on_line, tail), name="rank-output", daemon=True)
    reader.start()
    noted: set[str] = set()
    try:
        _wait(launcher, noted, timeout_s)
    finally:
        _stop(launcher)
        end_all(noted | tagged(tag))  # what the launcher left (e.g. it was SIGKILLed): ranks, engines, servers
        reader.join(timeout=5.0)
    return RanksResult(launcher.returncode, "\n".join(tail), log_dir)


def _stream(launcher: subprocess.Popen, on_line: Callable[[str], None], tail: collections.deque[str]) -> None:
    assert launcher.stdout is not None
    for line in launcher.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        on_line(line)


def _wait(launcher: subprocess.Popen, noted: set[str], timeout_s: float | None) -> None:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while launcher.poll() is None:
        noted |= descendants(launcher.pid)
        if deadline is not None and time.monotonic() > deadline:
            return
        time.sleep(POLL_S)


def _stop(launcher: subprocess.Popen) -> None:
    """SIGTERM to a launcher still running (it stops its ranks), SIGKILL after its grace."""
    if launcher.poll() is not None:
        return
    try:
        os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(STOP_GRACE_S + 5)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    except ProcessLookupError:
        launcher.wait()


def die_with_launcher() -> None:
    """Called first thing in a rank: Linux sends this rank SIGTERM when the process that started it dies (torchrun
    stops its ranks itself, unless it is SIGKILLed)."""
    if not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher:  # it died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def leave_process_group() -> None:
    """The last thing a rank does that succeeded: every rank waits for the others (no collective is still in
    flight anywhere), then takes its process group down itself: its gloo worker and transport threads joined, its
    connections and rank 0's rendezvous store closed, all before the interpreter exits. Left to the exit, they are
    torn down in whatever order module teardown and the C++ runtime's static destructors happen to take, while the
    peers' sockets close under them."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@dataclass(frozen=True)
class RankFailure:
    """The rank torchrun's failure summary names as the first to fail (the others it lists were stopped for it)."""

    rank: int
    local_rank: int
    exit_code: int | None

    def __str__(self) -> str:
        return f"rank {self.rank}" + (f" (exit code {self.exit_code})" if self.exit_code is not None else "")


def root_cause(tail: str) -> RankFailure | None:
    """The first failure in torchrun's summary at the end of `tail`; None when the summary is not there."""
    _, found, cause = tail.partition("Root Cause")
    rank = re.search(r"\brank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", cause)
    if not found or rank is None:
        return None
    code = re.search(r"exitcode\s*:\s*(-?\d+)", cause)
    return RankFailure(int(rank.group(1)), int(rank.group(2)), int(code.group(1)) if code else None)


def rank_log_tail(log_dir: Path, local_rank: int, lines: int = TAIL_LINES) -> str:
    """The end of what a rank of the latest launch into `log_dir` wrote to stderr (torchrun keeps one file a rank)."""
    logs = sorted(log_dir.glob(f"*/attempt_*/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    return "\n".join(logs[-1].read_text(errors="replace").splitlines()[-lines:]) if logs else ""
