"""Start N ranks of a command on this machine, the way `torchrun`/`deepspeed` do, on loopback.

    python -m pipeline.distributed.launch --nproc 2 -- python -m flows.train --params params.yaml

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR (127.0.0.1: torch's rendezvous
would otherwise listen on every interface) and a free MASTER_PORT. When one rank fails the
others are stopped (a rank blocked in a collective would otherwise wait forever); a rank also
gets SIGTERM when the launcher dies without stopping it (even by SIGKILL). Several
nodes: use the `deepspeed` launcher with a hostfile (docs/scale-out.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.services.processes import free_port, parent_death_signal

POLL_S = 0.2


def rank_env(rank: int, world: int, port: int, base: Mapping[str, str], threads: int | None) -> dict[str, str]:
    env = dict(base) | {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(".cache/torch_extensions").resolve()))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def launch(cmd: Sequence[str], nproc: int, *, env: Mapping[str, str] | None = None, threads: int | None = None,
           timeout_s: float | None = None) -> list[int]:
    """Run `cmd` as `nproc` ranks; returns their exit codes (all stopped when one fails or time runs out)."""
    port = free_port()
    base = dict(os.environ if env is None else env)
    procs = [subprocess.Popen(list(cmd), env=rank_env(r, nproc, port, base, threads), start_new_session=True,
                              preexec_fn=parent_death_signal()) for r in range(nproc)]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.poll() not in (None, 0) for p in procs)
            if failed or (deadline is not None and time.monotonic() > deadline):
                _stop(procs)
                break
            time.sleep(POLL_S)
    finally:
        _stop(procs)
    return [p.returncode for p in procs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start N local ranks of a command (loopback rendezvous).")
    parser.add_argument("--nproc", type=int, required=True, help="ranks to start on this machine")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per rank (CPU runs)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command each rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd or args.nproc < 1:
        parser.error("give --nproc >= 1 and a command after --")
    codes = launch(cmd, args.nproc, threads=args.threads)
    print(f"rank exit codes: {codes}", file=sys.stderr)
    return max((abs(c) for c in codes), default=0)


if __name__ == "__main__":
    raise SystemExit(main())
