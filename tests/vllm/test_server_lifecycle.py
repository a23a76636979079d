"""No vLLM server outlives the process that started it, even when that process is SIGKILLed (needs `.venv-vllm`):
a child process starts a real server through the pool and is killed with SIGKILL once the server answers; the
server's parent-death signal takes its API server down, which stops its engine and workers, and nothing of its
process group, nor of its shared memory in /dev/shm, is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]


def group_members(group: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == group:
                    found.append(int(entry))
            except ProcessLookupError:
                pass
    return found


def test_a_sigkilled_parent_leaves_no_server_process(tiny_dir: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from pipeline.inference.pool import ServerPool, Supervision
        from pipeline.inference.server import LaunchSpec
        from pipeline.services.processes import free_port
        spec = LaunchSpec("orphan", Path({str(tiny_dir)!r}), free_port(), Path({str(tmp_path)!r}),
                          python=sys.executable, max_model_len=512, kv_cache_gib=1)
        pool = ServerPool.launched([spec], Supervision(start_timeout_s=600.0, max_restarts=0)).start()
        print(pool.keepers[0].process.process.pid, ",".join(pool.keepers[0].process.shared_memory), flush=True)
        time.sleep(3600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    group = None
    try:
        first, *rest = parent.stdout.readline().split()
        group, segments = int(first), rest[0].split(",") if rest else []
        assert len(group_members(group)) >= 3  # the API server, its engine core and worker
        parent.kill()  # SIGKILL: nothing in the parent runs
        parent.wait()
        end = time.monotonic() + 120
        while group_members(group):
            assert time.monotonic() < end, f"left behind: {group_members(group)}"
            time.sleep(0.5)
        assert segments and not [p for p in segments if Path(p).exists()]  # nor its shared memory
    finally:
        parent.kill()
        if group is not None and group_members(group):  # a failed run must not leak what it tests for
            os.killpg(group, signal.SIGKILL)
