"""Child services never outlive the process that started them, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipeline.paths import REPO_ROOT

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pipeline.services.processes import ServiceProcess, free_port
    port = free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    service = ServiceProcess("http", server, port, Path(sys.argv[1]) / "http.log", health_path=None).start()
    print(service.process.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_service_dies_with_a_parent_killed_by_sigkill(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    alive = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    if alive:
        child.kill()
    assert not alive, "the service outlived its parent"
