"""No state of one request is reachable from the next: memory (frames, objects, freed
buffers), random generators, pid and inode counters, /tmp contents and inodes, descriptors.

All of it on the one-worker sandbox, so the attacker's request always follows the victim's
on the same worker; each test fails on a worker that forks snippets from its own heap, keeps
/tmp when it looks unchanged by name, or shares counters across requests.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import httpx
import pytest

from sandbox.code import pool as pool_module
from sandbox.code.pool import PoolSettings, WorkerPool
from sandbox.code.messages import Job
from tests.sandbox.support import UID_BASE, Sandbox, open_descriptors, worker_processes

MARKER = re.compile(r"VICTIM-[0-9a-f]{12}")

# Everything a snippet can reach in its own process: the frames above it, every object the
# collector knows, and raw memory (the brk heap and the regions around live objects, read
# through a pipe so that unreadable pages fail with EFAULT instead of crashing).
HARVEST = r'''
import fractions, re, numpy
sys = fractions.sys
os, gc = sys.modules['os'], sys.modules['gc']
ctypes = numpy.ctypeslib.ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.sbrk.restype = ctypes.c_void_p
libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
pattern = re.compile(rb'VICTIM-[0-9a-f]{12}')
found = set()
def look(blob):
    if isinstance(blob, str):
        blob = blob.encode('utf-8', 'surrogatepass')
    if isinstance(blob, (bytes, bytearray)):
        found.update(m.group().decode() for m in pattern.finditer(bytes(blob)))
try:
    raise RuntimeError
except RuntimeError as exc:
    frame = exc.__traceback__.tb_frame
while frame is not None:
    for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
        look(repr(value))
    frame = frame.f_back
for obj in gc.get_objects():
    try:
        look(repr(obj)[:100000])
    except Exception:
        pass
r, w = os.pipe()
PAGE = 4096
def readable(addr):
    n = libc.write(w, addr, PAGE)
    if n <= 0:
        return None
    return os.read(r, n)
regions = {id(o) >> 21 for o in gc.get_objects()[::50]}
top = libc.sbrk(0) >> 21
regions.update(range(top - 64, top + 1))
pages = 0
for region in sorted(regions):
    for addr in range((region - 1) << 21, (region + 2) << 21, PAGE):
        data = readable(addr)
        if data is not None:
            pages += 1
            look(data)
print('pages', pages > 100, 'found', sorted(found))
'''


def _run(sandbox: Sandbox, code: str, **extra) -> dict:
    return sandbox.run(code, timeout_s=30.0, **extra)


def test_a_snippet_finds_nothing_of_earlier_requests_anywhere_in_its_memory(lone_sandbox: Sandbox) -> None:
    victims = []
    for _ in range(3):
        marker = f"VICTIM-{uuid.uuid4().hex[:12]}"
        victims.append(marker)
        victim = _run(lone_sandbox, f"secret = '{marker}'\nprint(secret * 3)\n1 / 0")
        assert marker in victim["stdout"]
        attack = _run(lone_sandbox, HARVEST)
        assert attack["status"] == "ok", attack
        assert "pages True" in attack["stdout"], attack  # it did read memory
        assert MARKER.findall(attack["stdout"]) == [], (victims, attack["stdout"])


def test_frame_walk_to_the_worker_finds_no_previous_outcome(lone_sandbox: Sandbox) -> None:
    marker = f"VICTIM-{uuid.uuid4().hex[:12]}"
    _run(lone_sandbox, f"print('{marker}')")
    walk = ("try:\n    1/0\nexcept ZeroDivisionError as e:\n    f = e.__traceback__.tb_frame\n"
            "seen = []\nwhile f is not None:\n    seen.append(repr(f.f_locals)[:20000])\n    f = f.f_back\nprint(len(seen), seen)")
    result = _run(lone_sandbox, walk)
    assert result["status"] == "ok" and marker not in result["stdout"], result["stdout"][:2000]


def test_random_generators_differ_between_requests_on_one_worker(lone_sandbox: Sandbox) -> None:
    code = ("import random, numpy, sympy\nimport sympy.core.random as sr\n"
            "print(sympy.randprime(1, 10**12), sr.random(), random.random(), numpy.random.rand(), numpy.random.default_rng().random())")
    draws = [_run(lone_sandbox, code)["stdout"].split() for _ in range(4)]
    for generator in zip(*draws):
        assert len(set(generator)) == len(draws), draws


def test_pids_carry_nothing_from_one_request_to_the_next(lone_sandbox: Sandbox) -> None:
    probe = ("import fractions\nsys = fractions.sys\nt = sys.modules['threading']\nos = sys.modules['os']\n"
             "ids = []\nth = t.Thread(target=lambda: ids.append(t.get_native_id()))\nth.start(); th.join()\nprint(os.getpid(), ids)")
    spawner = ("import fractions\nt = fractions.sys.modules['threading']\n"
               "ts = [t.Thread(target=lambda: None) for _ in range(25)]\n[x.start() for x in ts]\n[x.join() for x in ts]")
    first = _run(lone_sandbox, probe)["stdout"]
    assert _run(lone_sandbox, spawner)["status"] == "ok"
    assert _run(lone_sandbox, probe)["stdout"] == first == "1 [2]\n"


def test_inode_numbers_carry_nothing_from_one_request_to_the_next(lone_sandbox: Sandbox) -> None:
    probe = "import fractions\nos = fractions.sys.modules['os']\nopen('/tmp/p', 'w').close()\nprint(os.stat('/tmp/p').st_ino)"
    churn = ("import fractions\nos = fractions.sys.modules['os']\nfor i in range(300):\n"
             "    open(f'/tmp/c{i}', 'w').close()\n    os.remove(f'/tmp/c{i}')\nprint(sorted(os.listdir('/tmp')))")
    first = _run(lone_sandbox, probe)["stdout"]
    assert _run(lone_sandbox, churn)["stdout"] == "[]\n"
    assert _run(lone_sandbox, probe)["stdout"] == first


def test_reading_tmp_leaves_no_trace_for_the_next_request(lone_sandbox: Sandbox) -> None:
    probe = "import fractions\nos = fractions.sys.modules['os']\ns = os.stat('/tmp')\nprint(s.st_atime_ns, s.st_mtime_ns, s.st_ino)"
    reader = "import fractions\nos = fractions.sys.modules['os']\nprint(os.listdir('/tmp'), [os.listdir('.') for _ in range(3)])"
    first = _run(lone_sandbox, probe)["stdout"]
    assert _run(lone_sandbox, reader)["status"] == "ok"
    assert _run(lone_sandbox, probe)["stdout"] == first  # no access time, no remount: nothing to see


def test_a_full_tmp_is_empty_again_for_the_next_request(lone_sandbox: Sandbox) -> None:
    fill = ("import fractions\nos = fractions.sys.modules['os']\nos.mkdir('/tmp/d')\ni = 0\ntry:\n    while True:\n"
            "        open(f'/tmp/d/{i}', 'w').close()\n        i += 1\nexcept OSError as e:\n    print('full after', i > 1000, e.errno)")
    assert "full after True 28" in _run(lone_sandbox, fill)["stdout"]
    check = "import fractions\nos = fractions.sys.modules['os']\nopen('/tmp/x', 'w').write('y' * 1000)\nprint(os.listdir('/tmp'))"
    assert _run(lone_sandbox, check)["stdout"] == "['x']\n"


def _post_raw(sandbox: Sandbox, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{sandbox.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)


@pytest.mark.parametrize("body", [
    b'{"language": "python", "code": "print(input())", "stdin": "\\ud800"}',
    b'{"language": "python", "code": "print(1)", "stdin": "a\\udfff\\ud800b"}',
    b'{"language": "python", "code": "print(\'\\ud800\')"}',
    b'{"code": "print(1)", "timeout_s": NaN}',
], ids=["lone_high_surrogate_stdin", "reversed_surrogates_stdin", "surrogate_in_code", "nan"])
def test_requests_with_unencodable_text_leave_no_descriptor_open(lone_sandbox: Sandbox, body: bytes) -> None:
    (worker,) = worker_processes(lone_sandbox.service.process.pid)
    before = open_descriptors(worker.pid)
    for _ in range(30):
        response = _post_raw(lone_sandbox, "/run_code" if b"language" in body else "/run", body)
        assert response.status_code in (200, 422), response.text
    (still,) = worker_processes(lone_sandbox.service.process.pid)
    assert still.pid == worker.pid, "the worker was replaced"
    assert open_descriptors(worker.pid) == before


BAD_JOBS = {
    "lone_surrogate_stdin": Job("print(input())", 5.0, 256, stdin="\ud800"),
    "surrogates_stdin": Job("print(1)", 5.0, 256, stdin="a\udfff\ud800b" * 100),
    "surrogate_in_code": Job("print('\ud800')", 5.0, 256),
    "bad_base64_file": Job("print(1)", 5.0, 256, files={"a.txt": "***"}),
    "surrogate_file_name": Job("print(1)", 5.0, 256, files={"\ud800.txt": ""}),
    "absolute_file_name": Job("print(1)", 5.0, 256, files={"/etc/x": ""}),
    "file_then_directory": Job("print(1)", 5.0, 256, files={"a": "", "a/b": ""}),
    "nul_fetch_name": Job("print(1)", 5.0, 256, fetch_files=("a\0b", "\udc80", "../x")),
    "syntax_error": Job("print(", 5.0, 256),
    "null_bytes_in_code": Job("print(1)\0", 5.0, 256),
}


async def test_every_error_path_in_the_worker_closes_what_it_opened() -> None:
    """Requests that fail at each step of the worker (encoding stdin, writing files, fetching,
    compiling), sent straight to a real worker: its descriptor count never moves and it is
    never replaced."""
    pool = WorkerPool(PoolSettings(workers=1, queue_size=4, isolated=True, uid_base=UID_BASE + 208, tmp_size_mib=8,
                                   output_limit_bytes=65536))
    await pool.start()
    try:
        (worker,) = pool._all.values()
        await pool.run(Job("print(1)", 5.0, 256))
        before = open_descriptors(worker.process.pid)
        for _ in range(10):
            for name, job in BAD_JOBS.items():
                outcome = await pool.run(job)
                assert outcome.status in ("ok", "error"), (name, outcome)
        assert open_descriptors(worker.process.pid) == before
        assert pool.stats()["replaced"] == {} and pool.stats()["restarts"] == 0
        assert (await pool.run(Job("print(2)", 5.0, 256))).stdout == "2\n"
    finally:
        await pool.close()


async def test_tmp_is_wiped_even_beside_a_python_installation_under_tmp(tmp_path: Path, monkeypatch) -> None:
    """A Python that lives under /tmp is bound back into every fresh /tmp; nothing a snippet
    writes beside it may survive (the directories leading to it are not writable, and the
    wipe is decided by the filesystem's counters, not by names). umask 0 makes those
    directories world-writable unless they are created with an explicit mode."""
    prefix = Path("/tmp") / f"fake-prefix-{uuid.uuid4().hex[:8]}"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "lib" / "marker.py").write_text("x = 1\n")
    real_paths = pool_module.jail_python_paths()
    monkeypatch.setattr(pool_module, "jail_python_paths", lambda: (*real_paths, str(prefix / "lib")))
    old_umask = os.umask(0)
    pool = WorkerPool(PoolSettings(workers=1, queue_size=4, isolated=True, uid_base=UID_BASE + 200, tmp_size_mib=8,
                                   output_limit_bytes=65536))
    try:
        await pool.start()
        write = ("import fractions\nos = fractions.sys.modules['os']\nwrote = []\n"
                 f"for path in ('{prefix}/note', '{prefix}/lib/note', '/tmp/note'):\n"
                 "    try:\n        open(path, 'w').write('mailbox')\n        wrote.append(path)\n    except OSError:\n        pass\n"
                 f"print(sorted(os.listdir('{prefix}')), wrote)")
        first = await pool.run(Job(write, 10.0, 256))
        read = ("import fractions\nos = fractions.sys.modules['os']\n"
                f"print([p for p in ('{prefix}/note', '{prefix}/lib/note', '/tmp/note') if os.path.exists(p)], "
                f"sorted(os.listdir('/tmp')), os.path.exists('{prefix}/lib/marker.py'))")
        second = await pool.run(Job(read, 10.0, 256))
    finally:
        os.umask(old_umask)
        await pool.close()
        (prefix / "lib" / "marker.py").unlink()
        (prefix / "lib").rmdir()
        prefix.rmdir()
    assert first.status == "ok", first
    assert second.stdout == f"[] ['{prefix.name}'] True\n", (first.stdout, second.stdout)
