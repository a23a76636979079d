"""The HTTP contract of the code sandbox: /run, SandboxFusion's /run_code, /health, limits."""

from __future__ import annotations

import ast
import base64
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from pipeline.services.processes import ServiceProcess, free_port, python_service
from sandbox.code import __main__ as cli
from sandbox.code import jail
from tests.sandbox.support import UID_BASE, WORKERS, Sandbox


def test_ok_run_reports_stdout_and_duration(sandbox: Sandbox) -> None:
    result = sandbox.run("import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**2 - 1))")
    assert result["status"] == "ok"
    assert result["stdout"] == "(x - 1)*(x + 1)\n"
    assert result["error"] is None
    assert 0 < result["duration_ms"] < 5000


def test_error_is_last_traceback_line_and_stdout_is_kept(sandbox: Sandbox) -> None:
    result = sandbox.run("print('before')\nx = 1 / 0")
    assert result["status"] == "error"
    assert result["stdout"] == "before\n"
    assert result["error"] == "ZeroDivisionError: division by zero"
    assert 'File "<snippet>", line 2' in result["stderr"] and "x = 1 / 0" in result["stderr"]


def test_syntax_error_is_an_error_without_running(sandbox: Sandbox) -> None:
    result = sandbox.run("print(1")
    assert result["status"] == "error"
    assert result["error"].startswith("SyntaxError")


def test_randomness_differs_between_requests(sandbox: Sandbox) -> None:
    code = "import random, numpy\nprint(random.random(), numpy.random.rand())"
    outputs = {sandbox.run(code)["stdout"] for _ in range(2 * WORKERS)}
    assert len(outputs) == 2 * WORKERS


def test_nothing_persists_into_the_next_request(sandbox: Sandbox) -> None:
    poison = ("open('/tmp/left-behind', 'w').write('x')\n"
              "import math\nmath.pi = 3\n__builtins__.print = lambda *a, **k: None\n")
    for _ in range(WORKERS):
        assert sandbox.run(poison)["status"] == "ok"
    check = "import math, fractions\nos = fractions.sys.modules['os']\nprint(os.path.exists('/tmp/left-behind'), math.pi)"
    for _ in range(2 * WORKERS):
        assert sandbox.run(check)["stdout"] == f"False {3.141592653589793}\n"


@pytest.mark.parametrize("body", [{}, {"code": 5}, {"code": "print(1)", "timeout_s": "soon"},
                                  {"code": "print(1)", "timeout_s": -1}, {"code": "print(1)", "memory_mb": 0}])
def test_malformed_body_is_422(sandbox: Sandbox, body: dict) -> None:
    assert httpx.post(f"{sandbox.url}/run", json=body).status_code == 422


def test_not_json_is_422(sandbox: Sandbox) -> None:
    response = httpx.post(f"{sandbox.url}/run", content=b"print(1)", headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_code_over_64_kib_is_413(sandbox: Sandbox) -> None:
    response = httpx.post(f"{sandbox.url}/run", json={"code": "#" * (64 * 1024 + 1)})
    assert response.status_code == 413
    assert "65536" in response.json()["detail"]
    assert sandbox.run("#" * (64 * 1024 - 10) + "\nprint(1)")["status"] == "ok"


def test_huge_body_is_413_before_reading(sandbox: Sandbox) -> None:
    response = httpx.post(f"{sandbox.url}/run", content=b"x" * (2 << 20), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_health_reports_pool_statistics(sandbox: Sandbox) -> None:
    before = sandbox.health()["served"]
    sandbox.run("1/0")
    health = sandbox.health()
    assert health["status"] == "ok" and health["isolation"] == "full"
    assert health["workers"] == WORKERS and health["idle"] + health["busy"] == WORKERS
    assert health["served"] == before + 1
    assert health["by_status"]["error"] >= 1
    assert set(health["by_status"]) == {"ok", "error", "timeout", "memory", "output_limit", "rejected"}


def _run_code(sandbox: Sandbox, **body) -> dict:
    response = httpx.post(f"{sandbox.url}/run_code", json={"language": "python", **body}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_run_code_success_has_sandboxfusion_shape(sandbox: Sandbox) -> None:
    answer = _run_code(sandbox, code="print(input()[::-1])", stdin="abc\n", compile_timeout=10, run_timeout=5)
    assert answer["status"] == "Success"
    assert answer["run_result"]["status"] == "Finished"
    assert answer["run_result"]["return_code"] == 0
    assert answer["run_result"]["stdout"] == "cba\n"
    assert set(answer) >= {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert set(answer["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}


def test_run_code_failure_and_timeout(sandbox: Sandbox) -> None:
    failed = _run_code(sandbox, code="import sys\n", run_timeout=5)
    assert failed["status"] == "Failed" and failed["run_result"]["return_code"] != 0
    assert "not allowed" in failed["run_result"]["stderr"]
    timed_out = _run_code(sandbox, code="while True: pass", run_timeout=0.5)
    assert timed_out["status"] == "Failed"
    assert timed_out["run_result"]["status"] == "TimeLimitExceeded"


def test_run_code_files_in_and_out_without_following_symlinks(sandbox: Sandbox) -> None:
    code = ("import fractions\nos = fractions.sys.modules['os']\n"
            "open('out.txt', 'w').write(open('data/in.txt').read().upper())\n"
            "os.symlink('/usr/lib/os-release', 'link.txt')")
    answer = _run_code(sandbox, code=code, files={"data/in.txt": base64.b64encode(b"hello").decode()},
                       fetch_files=["out.txt", "link.txt", "../../etc/hostname"])
    assert answer["status"] == "Success", answer
    assert answer["files"] == {"out.txt": base64.b64encode(b"HELLO").decode()}


def test_run_code_other_language_is_sandbox_error(sandbox: Sandbox) -> None:
    answer = _run_code(sandbox, code="int main(){}", language="cpp")
    assert answer["status"] == "SandboxError" and "python only" in answer["message"]


def test_without_root_the_server_refuses_with_a_reason(monkeypatch, capsys) -> None:
    monkeypatch.setattr(jail.os, "geteuid", lambda: 1000)
    assert cli.main(["--port", str(free_port())]) == 2
    message = capsys.readouterr().err
    assert "must run as root" in message and "--allow-degraded" in message and "network namespace" in message
    assert "here: not running as root" in message


def test_this_machine_can_isolate() -> None:
    assert jail.isolation_unavailable_reason() is None


@pytest.fixture(scope="module")
def tiny_sandbox(tmp_path_factory: pytest.TempPathFactory):
    """One worker, one queue slot, 1 s timeout cap: overload and replacement become observable.
    Shared by the two tests below, in file order (the replacement test kills the worker last)."""
    args = ["--workers", "1", "--queue-size", "1", "--max-timeout-s", "1", "--uid-base", str(UID_BASE + 128)]
    logs: Path = tmp_path_factory.mktemp("tiny-sandbox")
    with python_service("tiny-sandbox", "sandbox.code", args, free_port(), logs) as service:
        yield service


def _post(service: ServiceProcess, code: str, timeout_s: float = 5) -> httpx.Response:
    return httpx.post(f"{service.url}/run", json={"code": code, "timeout_s": timeout_s}, timeout=30)


def test_overload_is_429_with_retry_after_and_timeouts_are_capped(tiny_sandbox: ServiceProcess) -> None:
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_post, tiny_sandbox, "import time\ntime.sleep(30)", 30) for _ in range(4)]
        responses = [f.result() for f in futures]
    codes = sorted(r.status_code for r in responses)
    assert codes.count(200) == 2 and codes.count(429) == 2, codes  # one running, one queued
    assert all(r.headers["Retry-After"] for r in responses if r.status_code == 429)
    answered = [r.json() for r in responses if r.status_code == 200]
    assert all(a["status"] == "timeout" and a["duration_ms"] < 10_000 for a in answered), answered  # 30 s asked, 1 s cap


def test_a_dead_worker_is_replaced(tiny_sandbox: ServiceProcess) -> None:
    server = psutil.Process(tiny_sandbox.process.pid)
    (worker,) = [p for p in server.children() if "sandbox.code.worker" in " ".join(p.cmdline())]
    worker.kill()
    first = _post(tiny_sandbox, "print(1)")
    assert first.status_code == 200 and first.json()["status"] in ("ok", "error")
    deadline = time.monotonic() + 60
    while httpx.get(f"{tiny_sandbox.url}/health").json()["restarts"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _post(tiny_sandbox, "print(2)").json()["stdout"] == "2\n"
    assert httpx.get(f"{tiny_sandbox.url}/health").json()["workers"] == 1


async def test_degraded_mode_keeps_seccomp_rlimits_and_a_wiped_scratch_dir() -> None:
    """What `--allow-degraded` leaves (run here as root, but without namespaces or uid change)."""
    from sandbox.code.pool import PoolSettings, WorkerPool
    from sandbox.code.messages import Job

    pool = WorkerPool(PoolSettings(workers=1, queue_size=4, isolated=False, uid_base=UID_BASE + 192, tmp_size_mib=8,
                                   output_limit_bytes=4096))
    await pool.start()
    try:
        assert pool.stats()["isolation"] == "degraded"
        wrote = await pool.run(Job("open('left', 'w').write('x')\nprint('ok')", 5.0, 256))
        socket = await pool.run(Job("import fractions\nfractions.sys.modules['socket'].socket()", 5.0, 256))
        listed = await pool.run(Job("import fractions\nos = fractions.sys.modules['os']\nprint(os.listdir('.'), os.getuid())", 5.0, 256))
        flood = await pool.run(Job("while True: print('x' * 100)", 5.0, 256))
    finally:
        await pool.close()
    assert (wrote.status, wrote.stdout) == ("ok", "ok\n")
    assert socket.status == "error" and "PermissionError" in socket.error
    assert listed.stdout == f"[] {UID_BASE + 192}\n"  # root without namespaces still drops the uid
    assert flood.status == "output_limit" and len(flood.stdout) <= 4096


def test_snippets_see_only_a_minimal_environment(sandbox: Sandbox) -> None:
    code = "import fractions\nprint(sorted(fractions.sys.modules['os'].environ))"
    names = ast.literal_eval(sandbox.run(code)["stdout"])
    assert set(names) <= {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED",
                          "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MALLOC_ARENA_MAX",
                          "PYTHONHASHSEED"}
    assert "PATH" in names
