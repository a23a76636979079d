"""Nothing a request does outlives it: workers, zygotes and whole servers killed mid-request,
with real processes, and what the pool does about a child it cannot reap.

Every snippet is pid 1 of a PID namespace of its own, below its zygote's, which is pid 1 of
the worker's; the kernel kills a namespace with its first process. These tests kill each
level while a snippet that tries to survive (signals ignored, threads started) is running,
then look for any process of the snippet's uid on the host.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from pipeline.services.processes import free_port, python_service
from tests.sandbox.support import (LONE_UID_BASE, UID_BASE, Sandbox, sandbox_processes, wait_until, worker_processes,
                                   zygote_of)

SURVIVOR = (
    "import fractions\nsys = fractions.sys\nsignal, threading, time = (sys.modules[m] for m in ('signal', 'threading', 'time'))\n"
    "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1):\n    signal.signal(s, signal.SIG_IGN)\n"
    "for _ in range(4):\n    threading.Thread(target=time.sleep, args=(600,), daemon=False).start()\n"
    "print('started', flush=True)\ntime.sleep(600)\n"
)


def _post(url: str, code: str, timeout_s: float) -> httpx.Response:
    return httpx.post(f"{url}/run", json={"code": code, "timeout_s": timeout_s}, timeout=timeout_s + 60)


def _health(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=30).json()


def _lone_snippets() -> list[int]:
    return sandbox_processes(LONE_UID_BASE, 1)


@pytest.mark.parametrize("victim", ["worker", "zygote"])
def test_killing_the_worker_mid_request_leaves_nothing_of_the_request(lone_sandbox: Sandbox, victim: str) -> None:
    restarts = _health(lone_sandbox.url)["restarts"]
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, lone_sandbox.url, SURVIVOR, 10.0)
        assert wait_until(lambda: len(_lone_snippets()) > 0), "the snippet never started"
        (worker,) = worker_processes(lone_sandbox.service.process.pid)
        (zygote_of(worker) if victim == "zygote" else worker).kill()
        response = answer.result()
    assert response.status_code == 200 and response.json()["status"] == "error", response.text
    assert wait_until(lambda: not _lone_snippets()), f"snippet processes survived: {_lone_snippets()}"
    assert wait_until(lambda: _health(lone_sandbox.url)["restarts"] > restarts and _health(lone_sandbox.url)["workers"] == 1)
    replaced = _health(lone_sandbox.url)["replaced"]
    assert replaced.get("zygote" if victim == "zygote" else "crashed", 0) >= 1, replaced
    after = _post(lone_sandbox.url, "print(6 * 7)", 5.0).json()
    assert (after["status"], after["stdout"]) == ("ok", "42\n"), after


def test_killing_the_server_mid_request_leaves_nothing(tmp_path: Path) -> None:
    uid_base = UID_BASE + 160
    service = python_service("doomed-sandbox", "sandbox.code", ["--workers", "1", "--uid-base", str(uid_base)],
                             free_port(), tmp_path).start(timeout_s=120)
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(_post, service.url, SURVIVOR, 10.0)
            assert wait_until(lambda: len(sandbox_processes(uid_base, 1)) > 0)
            family = [service.process.pid, *(p.pid for p in psutil.Process(service.process.pid).children(recursive=True))]
            service.process.send_signal(signal.SIGKILL)
            service.process.wait()
        assert wait_until(lambda: not sandbox_processes(uid_base, 1)), sandbox_processes(uid_base, 1)
        assert wait_until(lambda: not [pid for pid in family if psutil.pid_exists(pid) and
                                       psutil.Process(pid).status() != psutil.STATUS_ZOMBIE])
    finally:
        service.stop()


def test_a_child_that_cannot_be_reaped_is_reported_and_its_worker_replaced(lone_sandbox: Sandbox) -> None:
    """A stopped zygote cannot reap: the worker says so instead of waiting, and is replaced."""
    before = _health(lone_sandbox.url)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, lone_sandbox.url, "import time\nprint('in', flush=True)\ntime.sleep(600)", 1.0)
        assert wait_until(lambda: len(_lone_snippets()) > 0)
        (worker,) = worker_processes(lone_sandbox.service.process.pid)
        zygote_of(worker).send_signal(signal.SIGSTOP)
        response = answer.result()
    assert response.json()["status"] == "error" and "unreaped" in response.json()["error"], response.json()
    assert wait_until(lambda: _health(lone_sandbox.url)["restarts"] > before["restarts"])
    health = _health(lone_sandbox.url)
    assert health["unreaped"] == before["unreaped"] + 1
    assert health["replaced"].get("unreaped", 0) == before["replaced"].get("unreaped", 0) + 1
    assert wait_until(lambda: not _lone_snippets())
    assert _post(lone_sandbox.url, "print(1)", 5.0).json()["stdout"] == "1\n"


def test_health_reports_the_isolation_model(lone_sandbox: Sandbox) -> None:
    health = _health(lone_sandbox.url)
    assert health["pid_namespace"] == "per-snippet"
    assert health["memory_limit"]["mode"] == "rlimit+memfd-denied" and health["memory_limit"]["memfd"] == "denied"
    assert {"unreaped", "replaced", "restarts"} <= set(health)


def test_a_snippet_stops_at_its_deadline_with_every_thread(lone_sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = _post(lone_sandbox.url, SURVIVOR, 1.0).json()
    assert result["status"] == "timeout" and result["stdout"] == "started\n"
    assert wait_until(lambda: not _lone_snippets())
    assert time.monotonic() - started < 600  # liveness only: it did not wait for the threads
