"""The seccomp filter is an allow-list, and the allowed stack still works under it.

`WORKLOADS` (numpy, sympy, scipy, mpmath, the rest of the allowed stdlib, threads, files,
stdin, signals, errors and limits) are the ones `python -m sandbox.code.syscall_census`
measured the list on. The property test calls every system call number the list does not
name, from inside a snippet: each must fail with ENOSYS or EPERM.
"""

from __future__ import annotations

import ast
import ctypes
import ctypes.util
import os

import httpx
import pytest

from sandbox.code import seccomp
from sandbox.code.syscall_census import STDIN, WORKLOADS
from tests.sandbox.support import Sandbox

EXPECTED = {
    "print": ("ok", "42\n"), "numpy": ("ok", "True (50,)"), "sympy": ("ok", "[2, 3] (x - 1)*(x + 1)*(x**2 + 1)"),
    "scipy": ("ok", "1.259921 2.0"), "numpy_large": ("ok", "8388608 8388608.0"), "mpmath": ("ok", "3.14159265358979323846"), "stdlib": ("ok", "126410606437752"),
    "threads": ("ok", "[0, 1, 2, 3, 4, 5, 6, 7]"), "files": ("ok", "b'abc'"), "stdin": ("ok", "HELLO FROM STDIN"),
    "signals_and_timers": ("ok", "alarm"), "errors": ("error", "recursion RecursionError"), "memory_error": ("memory", ""),
    "output_flood": ("output_limit", "x"), "exit": ("error", ""),
}


def _allowed_numbers() -> set[int]:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp"))
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    checked = ("open", "openat", "ioctl", "prctl", "clone", "fcntl", "madvise", "preadv2", "pwritev2")
    names = (*seccomp.ALLOWED_SYSCALLS, *checked)  # + argument-checked ones
    return {n for n in (lib.seccomp_syscall_resolve_name(name.encode()) for name in names) if n >= 0}


def test_every_workload_has_an_expectation() -> None:
    assert set(EXPECTED) == set(WORKLOADS)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_the_allowed_stack_runs_under_the_filter(sandbox: Sandbox, name: str) -> None:
    status, stdout_has = EXPECTED[name]
    body = {"language": "python", "code": WORKLOADS[name], "stdin": STDIN, "run_timeout": 20, "memory_limit_MB": 1024}
    answer = httpx.post(f"{sandbox.url}/run_code", json=body, timeout=80).json()
    run = answer["run_result"]
    ok = answer["status"] == "Success"
    assert ok == (status == "ok"), answer
    assert stdout_has in run["stdout"], answer
    assert "Function not implemented" not in run["stderr"] and "Errno 38" not in run["stderr"], run["stderr"]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers below are x86_64's")
def test_every_call_off_the_list_fails_with_enosys_or_eperm(sandbox: Sandbox) -> None:
    allowed = sorted(_allowed_numbers())
    code = ("import numpy\nctypes = numpy.ctypeslib.ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"allowed = set({allowed})\nran = []\n"
            "for nr in [*range(0, 335), *range(424, 470)]:\n    if nr in allowed:\n        continue\n    ctypes.set_errno(0)\n"
            "    r = libc.syscall(ctypes.c_long(nr), 0, 0, 0, 0, 0, 0)\n    e = ctypes.get_errno()\n"
            "    if not (r == -1 and e in (1, 38)):\n        ran.append((nr, r, e))\nprint('ran', ran)")
    result = sandbox.run(code, timeout_s=20.0)
    assert result["status"] == "ok", result
    assert result["stdout"] == "ran []\n", result["stdout"]


def test_the_calls_that_must_stay_out_are_on_no_allow_list() -> None:
    must_stay_out = {"io_setup", "io_submit", "io_uring_setup", "io_uring_enter", "io_uring_register", "inotify_init",
                     "inotify_init1", "inotify_add_watch", "listmount", "statmount", "sync", "syncfs", "sync_file_range",
                     "userfaultfd", "perf_event_open", "bpf", "keyctl", "add_key", "request_key", "memfd_create",
                     "memfd_secret", "fanotify_init", "setxattr", "fsetxattr", "lsetxattr", "ptrace", "personality",
                     "execve", "fork", "vfork", "socket", "unshare", "setns", "mount",
                     "mincore", "cachestat", "fadvise64", "readahead", "madvise", "preadv2", "pwritev2"}
    assert not must_stay_out & set(seccomp.ALLOWED_SYSCALLS)
    assert must_stay_out - {"madvise", "preadv2", "pwritev2"} <= set(seccomp.DENIED_SYSCALLS)  # those by argument


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers below are x86_64's")
def test_page_cache_arguments_are_checked_for_every_value(sandbox: Sandbox) -> None:
    """Every madvise advice and every RWF flag bit, from inside a snippet: the allowed ones reach the
    kernel, the page-cache ones (PAGEOUT, COLD, MERGEABLE, COLLAPSE; NOWAIT, DONTCACHE) and unknown
    ones are refused by the filter (EPERM, or ENOSYS where the kernel would have said EINVAL)."""
    code = ("import numpy, fractions\nctypes = numpy.ctypeslib.ctypes\nos = fractions.sys.modules['os']\n"
            "libc = ctypes.CDLL(None, use_errno=True)\nmmap = fractions.sys.modules['importlib'].import_module('mmap')\n"
            "def call(nr, *args):\n    ctypes.set_errno(0)\n"
            "    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n"
            "    return 0 if r >= 0 else ctypes.get_errno()\n"
            "advice = {}\nfor a in [*range(0, 40), *range(100, 110), (1 << 32) | 21, (1 << 40) | 4]:\n"
            "    m = mmap.mmap(-1, 1 << 21)\n    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
            "    advice[a] = call(28, addr, 1 << 21, a)\n"
            "fd = os.open('/tmp/f', os.O_RDWR | os.O_CREAT)\nos.write(fd, b'x' * 4096)\n"
            "buf = ctypes.create_string_buffer(4096)\niov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 4096)\n"
            "flags = {}\nfor bit in [*range(32), 32, 35, 63]:\n"
            "    flags[bit] = (call(327, fd, ctypes.addressof(iov), 1, 0, 0, 1 << bit),\n"
            "                  call(328, fd, ctypes.addressof(iov), 1, 0, 0, 1 << bit))\n"
            "print(advice)\nprint(flags)\nprint(call(327, fd, ctypes.addressof(iov), 1, 0, 0, 0x2 | 0x8))")
    result = sandbox.run(code, timeout_s=20.0)
    assert result["status"] == "ok", result
    advice_line, flags_line, mixed = result["stdout"].splitlines()
    advice, flags = ast.literal_eval(advice_line), ast.literal_eval(flags_line)
    for value, err in advice.items():
        value &= 0xFFFFFFFF  # the kernel reads an int: high bits change nothing, for it or for the filter
        if value in seccomp.ALLOWED_MADVICE:
            assert err not in (1, 38), (value, err)  # the kernel's answer (0, or EINVAL for an unfitting advice)
        else:
            assert err == (1 if value in seccomp.REFUSED_MADVICE else 38), (value, err)
    for bit, errs in flags.items():
        allowed = bit >= 32 or bool((1 << bit) & seccomp.ALLOWED_RWF_FLAGS)  # the kernel reads 32 bits
        assert all((err != 38) == allowed for err in errs), (bit, errs)
    assert mixed == "38"  # an allowed flag does not carry a refused one through
