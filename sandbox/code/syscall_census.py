"""Which system calls real snippets make: the measurement behind the seccomp allow-list.

    python -m sandbox.code.syscall_census [--out FILE]      (as root, needs strace)

Starts one worker (full isolation) with a filter that allows everything on top of the
usual jail, attaches strace to its zygote (following every fork), runs `WORKLOADS`
(numpy, sympy, scipy, mpmath and the rest of the allowed stack, threads, files in /tmp,
stdin, signals, timers, errors, deep recursion, memory and output limits), and prints the
names of the calls the snippets (and their threads) made under their filter, as a
JSON list on the last line (and, on stderr, the statuses and the arguments seen for the calls
the filter checks by argument). `sandbox.code.seccomp.ALLOWED_SYSCALLS` is that list (plus
a few calls glibc makes on rarer paths, each commented), and `tests/sandbox/test_seccomp_allow_list.py`
runs the same workloads through the real filter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time

WORKLOADS = {
    "print": "print(6 * 7)",
    "numpy": ("import numpy as np\nrng = np.random.default_rng()\na = rng.random((50, 50))\n"
              "print(np.linalg.solve(a + 50 * np.eye(50), np.ones(50)).sum() > 0, np.linalg.eigvals(a).shape,\n"
              "      np.fft.fft(np.ones(64)).real[0], np.linalg.svd(a)[1].shape, np.random.rand() < 1)\n"
              "np.save('/tmp/a.npy', a)\nprint(np.load('/tmp/a.npy').shape)\nprint(np.array2string(a[:2, :2]) != '')"),
    "sympy": ("import sympy as sp\nx, y = sp.symbols('x y')\nprint(sp.solve(x**2 - 5*x + 6, x), sp.factor(x**4 - 1))\n"
              "print(sp.integrate(sp.sin(x) * sp.exp(x), x), sp.limit(sp.sin(x) / x, x, 0), sp.series(sp.cos(x), x, 0, 6))\n"
              "print(sp.Matrix([[1, 2], [3, 4]]).eigenvals(), sp.nsolve(sp.cos(x) - x, x, 1), sp.isprime(2**61 - 1))\n"
              "print(sp.simplify((x**2 - 1) / (x - 1)), sp.latex(sp.Integral(x**2, x)), sp.randprime(10, 10**6) > 0)\n"
              "print(sp.dsolve(sp.Function('f')(x).diff(x) - sp.Function('f')(x)), sp.N(sp.pi, 50))"),
    "scipy": ("import numpy as np\nfrom scipy import optimize, integrate, special, linalg, stats, sparse, interpolate\n"
              "print(round(optimize.brentq(lambda t: t**3 - 2, 0, 2), 6), round(integrate.quad(np.sin, 0, np.pi)[0], 6))\n"
              "print(special.gamma(5), linalg.det(np.eye(3)), stats.norm.cdf(0), sparse.eye(3).nnz)\n"
              "print(optimize.minimize(lambda v: (v[0] - 1)**2 + (v[1] + 2)**2, [0, 0]).x.round(3))\n"
              "print(interpolate.interp1d([0, 1, 2], [0, 1, 4])(1.5), integrate.solve_ivp(lambda t, y: -y, (0, 1), [1]).success)"),
    "numpy_large": "import numpy as np\na = np.ones((1024, 1024))\nprint(a.nbytes, (a @ a[:, :8]).sum())",  # madvise
    "mpmath": "import mpmath\nmpmath.mp.dps = 50\nprint(mpmath.pi, mpmath.zeta(3), mpmath.quad(mpmath.sin, [0, mpmath.pi]))",
    "stdlib": ("import math, cmath, fractions, decimal, statistics, itertools, functools, collections, re, datetime\n"
               "import random, heapq, bisect, string, copy, json, time, array, enum, textwrap, dataclasses, typing\n"
               "print(math.comb(50, 25), fractions.Fraction(3, 7) ** 20, decimal.Decimal(2).sqrt(), statistics.stdev([1, 2, 4]))\n"
               "print(re.findall(r'\\d+', 'a1b22'), datetime.datetime.now().year > 2000, random.random() < 1, time.time() > 0)\n"
               "print(json.dumps({'a': [1, 2]}), time.perf_counter() > 0, time.process_time() >= 0, datetime.date.today())"),
    "threads": ("import fractions\nthreading = fractions.sys.modules['threading']\nimport time\nout = []\n"
                "ts = [threading.Thread(target=lambda i=i: (time.sleep(0.01), out.append(i))) for i in range(8)]\n"
                "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))\n"
                "cf = fractions.sys.modules['concurrent.futures'] if 'concurrent.futures' in fractions.sys.modules else None\n"
                "lock = threading.Lock()\nwith lock:\n    print(threading.active_count())"),
    "files": ("import fractions\nos = fractions.sys.modules['os']\nshutil = fractions.sys.modules['shutil']\n"
              "os.makedirs('/tmp/d/e', exist_ok=True)\nopen('/tmp/d/e/f.txt', 'w').write('x' * 10000)\n"
              "shutil.copy('/tmp/d/e/f.txt', '/tmp/g.txt')\nos.rename('/tmp/g.txt', '/tmp/h.txt')\n"
              "print(sorted(os.listdir('/tmp')), os.path.getsize('/tmp/h.txt'), os.stat('/tmp/d').st_mode > 0)\n"
              "tempfile = fractions.sys.modules['tempfile']\nwith tempfile.TemporaryFile() as t:\n    t.write(b'abc'); t.seek(0); print(t.read())\n"
              "with tempfile.NamedTemporaryFile('w', dir='/tmp') as t:\n    print(os.path.exists(t.name))\n"
              "os.remove('/tmp/h.txt')\nshutil.rmtree('/tmp/d')\nprint(os.getcwd(), os.listdir('.'))"),
    "stdin": "import fractions\nprint(input().upper(), fractions.sys.stdin.read() == '')",
    "signals_and_timers": ("import fractions\nsignal = fractions.sys.modules['signal']\nimport time\n"
                           "signal.signal(signal.SIGALRM, lambda *a: print('alarm'))\nsignal.setitimer(signal.ITIMER_REAL, 0.01)\n"
                           "time.sleep(0.05)\nsignal.alarm(0)\nprint(time.monotonic() > 0)"),
    "errors": "def f(n):\n    return f(n + 1)\ntry:\n    f(0)\nexcept RecursionError as e:\n    print('recursion', type(e).__name__)\n1 / 0",
    "memory_error": "b = bytearray(10**11)",
    "output_flood": "while True:\n    print('x' * 1000)",
    "exit": "import fractions\nfractions.sys.exit(3)",
}
STDIN = "hello from stdin\n"


def _filtered_calls(path: str, zygote_pid: int) -> list[tuple[str, str]]:
    """(name, strace line) of the calls made under the filter in a `strace -f` log of the zygote: a
    snippet's after its `prctl(PR_SET_SECCOMP, ...)`, and every call of its threads, which inherit the
    filter and never install one (clone returns their pids in the snippet's PID namespace, so the log
    cannot tie them to their parent: every traced pid but the zygote's is a snippet's process or thread)."""
    call = re.compile(r"^(\d+)\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]")
    with open(path) as log:
        calls = [(m.group(1), m.group(2), line) for line in log if (m := call.match(line))]

    def locks(name: str, line: str) -> bool:
        return name == "seccomp" or (name == "prctl" and "PR_SET_SECCOMP" in line)

    locking = {pid for pid, name, line in calls if locks(name, line)}
    filtered: set[str] = set()
    seen: list[tuple[str, str]] = []
    for pid, name, line in calls:
        if (pid in filtered or (pid not in locking and pid != str(zygote_pid))) and name not in (
                "resumed", "exited", "killed"):
            seen.append((name, line))
        if pid in locking and locks(name, line):
            filtered.add(pid)
    return seen


def _checked_arguments(calls: list[tuple[str, str]]) -> dict[str, list[str]]:
    """The last argument seen for each call the filter checks by it (madvise advice, RWF flags)."""
    checked = re.compile(r"^\d+\s+(madvise|preadv2|pwritev2)\((.*?)(?:\)\s+=|\s+<unfinished)")
    values: dict[str, set[str]] = {"madvise": set(), "preadv2": set(), "pwritev2": set()}
    for _, line in calls:
        if match := checked.match(line):
            values[match.group(1)].add(match.group(2).rsplit(", ", 1)[-1])
    return {name: sorted(found) for name, found in values.items()}


async def _census(out_path: str) -> set[str]:
    from sandbox.code.pool import PoolSettings, WorkerPool
    from sandbox.code.messages import Job

    pool = WorkerPool(PoolSettings(workers=1, queue_size=4, isolated=True, uid_base=3_990_000, tmp_size_mib=32,
                                   output_limit_bytes=65536, seccomp="census"))
    await pool.start()
    try:
        (worker,) = pool._all.values()
        zygote_pid = worker.zygote_pid
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", out_path, "-p", str(zygote_pid)],
                                  stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # strace attaches asynchronously
        results = {}
        for name, code in WORKLOADS.items():
            outcome = await pool.run(Job(code, 20.0, 1024, stdin=STDIN))
            results[name] = outcome.status
        tracer.terminate()
        tracer.wait()
    finally:
        await pool.close()
    print(json.dumps(results), file=sys.stderr)
    calls = _filtered_calls(out_path, zygote_pid)
    print(json.dumps(_checked_arguments(calls)), file=sys.stderr)
    return {name for name, _ in calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="Keep the strace log here.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        names = asyncio.run(_census(args.out or os.path.join(scratch, "strace.log")))
    print(json.dumps(sorted(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
