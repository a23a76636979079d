"""Hostile snippets: each must get its expected status and leave the host, the server and
a concurrent benign request untouched.

Placeholders in the snippets: @MARK@ (a fresh token; any file whose name holds it must
not appear on the host), @REDIS@ (a live Redis port), @SERVER@ (the sandbox's own port),
@REPO@ (this repository), @SITE@ (the virtualenv's site-packages).
"""

from __future__ import annotations

import os
import site
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.code.pool import jail_python_paths
from tests.sandbox.support import WORKERS, Sandbox, sandbox_processes

SITE = site.getsitepackages()[0]
BENIGN = ("import math\nprint(sum(range(10)), math.comb(5, 2))", "45 10\n")
OS = "import fractions\nos = fractions.sys.modules['os']\n"
SYS = "import fractions\nsys = fractions.sys\n"
# A raw system call from the snippet; prints "blocked" when the filter refused it (EPERM or ENOSYS).
RAW = ("import numpy\nctypes = numpy.ctypeslib.ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
       "def call(nr, *args):\n    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n"
       "    e = ctypes.get_errno()\n    print('blocked' if r == -1 and e in (1, 38) else f'ran {r} errno {e}')\n")


def raw_call(name: str, nr: int, *args: int) -> Case:
    """A system call the allow-list must keep out (x86_64 numbers)."""
    return Case(f"syscall_{name}", RAW + f"call({nr}, {', '.join(map(str, args)) or '0'})", ("ok",), stdout_has="blocked")


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    statuses: tuple[str, ...]
    timeout_s: float = 5.0
    memory_mb: int = 512
    stdout_has: str | None = None  # proof the snippet ran past the point that matters
    error_has: str | None = None


CASES = [
    # --- import and escape tricks (the allow-list is a courtesy; the OS must hold anyway)
    Case("import_os", "import os\nos.system('touch /tmp/x-@MARK@')", ("rejected",), error_has="module 'os' is not allowed"),
    Case("from_subprocess", "from subprocess import run\nrun(['id'])", ("rejected",)),
    Case("dunder_import", "__import__('os').system('touch /tmp/x-@MARK@')", ("error",), error_has="ImportError"),
    Case("importlib", "import importlib\nimportlib.import_module('o' + 's')", ("rejected",)),
    Case("builtins_dict_import", "f = __builtins__.__dict__['__import__'] if hasattr(__builtins__, '__dict__') else __builtins__['__import__']\nf('socket')", ("error",)),
    Case("subclasses_wrap_close",
         "c = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]\n"
         "r = c.__init__.__globals__['system']('touch /tmp/x-@MARK@ /root/x-@MARK@')\nprint('system returned', r)",
         ("ok",), stdout_has="system returned 32512"),
    Case("catch_warnings_builtins",
         "w = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()\n"
         "b = w._module.__builtins__\nos = b['__import__']('fractions').sys.modules['os']\nprint(os.system('id'))",
         ("ok",), stdout_has="32512"),
    Case("sympy_hands_out_os", "import sympy\nprint(sympy.utilities.misc.os.system('touch /tmp/x-@MARK@'))", ("ok",), stdout_has="32512"),
    Case("numpy_ctypes_system", "import numpy\nlibc = numpy.ctypeslib.ctypes.CDLL(None)\nprint(libc.system(b'touch /tmp/x-@MARK@'))", ("ok",), stdout_has="32512"),
    Case("ctypes_fork_syscall", "import numpy\nlibc = numpy.ctypeslib.ctypes.CDLL(None)\nprint('fork', libc.fork())", ("ok",), stdout_has="fork -1"),
    Case("posix_fork", "import fractions\nposix = fractions.sys.modules['posix']\nposix.fork()", ("error",), error_has="PermissionError"),
    Case("os_execv", OS + "os.execv('/bin/sh', ['sh', '-c', 'touch /tmp/x-@MARK@'])", ("error",), error_has="PermissionError"),
    Case("posix_spawn", OS + "os.posix_spawn('/usr/bin/touch', ['touch', '/tmp/x-@MARK@'], {})", ("error",), error_has="PermissionError"),
    Case("pickle_reduce", SYS + "p = sys.modules['pickle']\nprint(p.loads(b\"cos\\nsystem\\n(S'touch /tmp/x-@MARK@'\\ntR.\"))", ("ok", "error")),
    Case("str_format_walk", "import fractions\nprint('{0.__globals__[sys].modules[os].environ}'.format(fractions.Fraction.__new__))", ("ok",), stdout_has="PATH"),
    Case("frame_walk_to_worker",
         SYS + "f = sys._getframe()\nnames = []\nwhile f is not None:\n    names += list(f.f_locals)\n    ch = f.f_locals.get('channel')\n"
         "    if ch is not None:\n        ch.sendall(b'\\x00\\x00\\x00\\x02{}')\n    f = f.f_back\nprint('walked', len(names))",
         ("ok", "error")),
    Case("gc_objects_for_secrets", SYS + "gc = sys.modules['gc']\nprint(sum(1 for o in gc.get_objects() if isinstance(o, dict)) > 0)", ("ok",), stdout_has="True"),
    Case("sympify_eval", "import sympy\nprint(sympy.sympify(\"__import__('os').system('touch /tmp/x-@MARK@')\"))", ("error", "ok")),
    Case("subprocess_via_sympy_gtk", "from sympy.printing import gtk\ngtk.subprocess.run(['touch', '/tmp/x-@MARK@'])", ("error",), error_has="PermissionError"),
    # --- reads
    Case("read_etc_passwd", "print(open('/etc/passwd').read())", ("error",), error_has="FileNotFoundError"),
    Case("read_etc_shadow", "print(open('/etc/shadow').read())", ("error",)),
    Case("read_proc_environ", "print(open('/proc/self/environ').read())", ("error",)),
    Case("read_proc_1_environ", "print(open('/proc/1/environ', 'rb').read())", ("error",)),
    Case("os_environ", OS + "print(dict(os.environ))", ("ok",), stdout_has="PATH"),
    Case("read_server_source", "print(open('@REPO@/sandbox/code/app.py').read())", ("error",), error_has="FileNotFoundError"),
    Case("read_params", "print(open('@REPO@/params.yaml').read())", ("error",)),
    Case("list_home_dirs", OS + "print(os.listdir('/root'), os.path.exists('/home'))\nprint(open('/root/.bashrc').read())", ("error",)),
    # The private /tmp shows nothing of the host's, except a Python installation that lives there
    # (e.g. a checkout cloned under /tmp), read-only.
    Case("list_host_tmp", OS + "print(sorted(os.listdir('/tmp')))", ("ok",), stdout_has="@TMP_LISTING@"),
    # --- writes and persistence
    Case("write_etc", "open('/etc/x-@MARK@', 'w').write('owned')", ("error",)),
    Case("write_sitecustomize", "open('@SITE@/x-@MARK@.py', 'w').write('import os')", ("error",)),
    Case("overwrite_usr_bin", "open('/usr/bin/python3', 'w').write('')", ("error",)),
    Case("write_root_home", "open('/root/x-@MARK@', 'w').write('x')", ("error",)),
    Case("write_dev_shm", "open('/dev/shm/x-@MARK@', 'w').write('x')", ("error",)),
    Case("write_private_tmp", "open('/tmp/x-@MARK@', 'w').write('x')\nprint('wrote')", ("ok",), stdout_has="wrote"),
    Case("fill_disk", "f = open('/tmp/big', 'wb')\nfor _ in range(200):\n    f.write(b'x' * (1 << 20))", ("error",)),
    Case("inode_exhaustion", "for i in range(100000):\n    open(f'/tmp/f{i}', 'w').close()", ("error",)),
    Case("sysv_shared_memory", "import numpy\nlibc = numpy.ctypeslib.ctypes.CDLL(None)\nprint('shmget', libc.shmget(0x7a7a, 4096, 0o1666))", ("ok",), stdout_has="shmget -1"),
    Case("dev_null_is_usable", "open('/dev/null', 'w').write('x')\nprint(len(open('/dev/urandom', 'rb').read(8)))", ("ok",), stdout_has="8"),
    Case("mkfifo", OS + "os.mkfifo('/tmp/fifo')", ("error",), error_has="PermissionError"),
    Case("chmod_setuid_bit", OS + "open('/tmp/s', 'w').close()\nos.chmod('/tmp/s', 0o4777)\nos.setuid(0)", ("error",), error_has="PermissionError"),
    # --- network
    Case("tcp_to_redis", SYS + "s = sys.modules['socket'].create_connection(('127.0.0.1', @REDIS@), timeout=1)\ns.sendall(b'FLUSHALL\\r\\n')", ("error",)),
    Case("tcp_to_this_server", SYS + "s = sys.modules['socket'].create_connection(('127.0.0.1', @SERVER@), timeout=1)", ("error",)),
    Case("tcp_outside", SYS + "sys.modules['socket'].create_connection(('1.1.1.1', 53), timeout=1)", ("error",)),
    Case("dns_lookup", SYS + "print(sys.modules['socket'].getaddrinfo('example.com', 80))", ("error",)),
    Case("unix_socket", SYS + "socket = sys.modules['socket']\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/docker.sock')", ("error",)),
    Case("udp_send", SYS + "socket = sys.modules['socket']\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))", ("error",)),
    # --- processes
    Case("fork_bomb", OS + "while True:\n    os.fork()", ("error",), error_has="PermissionError"),
    Case("thread_bomb", SYS + "t = sys.modules['threading']\nwhile True:\n    t.Thread(target=sys.modules['time'].sleep, args=(60,), daemon=True).start()",
         ("error", "memory")),
    Case("multiprocessing", SYS + "sys.modules['subprocess'].Popen(['sleep', '60'])", ("error",), error_has="PermissionError"),
    # The snippet is pid 1 of its own PID namespace: its parent is not even visible (ppid 0).
    Case("kill_parent", OS + "print(os.getppid())\nos.kill(os.getppid(), 9)\nprint('survived')", ("ok",), stdout_has="0\nsurvived"),
    # kill(-1) reaches every process in the snippet's namespace but itself: there are none.
    Case("kill_everything", OS + "os.kill(-1, 9)\nprint('survived')", ("error",), error_has="ProcessLookupError"),
    Case("setsid_daemon", OS + "os.setsid()\nif os.fork() == 0:\n    import time\n    time.sleep(60)", ("error",)),
    Case("ptrace_parent", "import numpy\nlibc = numpy.ctypeslib.ctypes.CDLL(None)\nprint('ptrace', libc.ptrace(16, 1, 0, 0))", ("ok",), stdout_has="ptrace -1"),
    Case("unshare_user_ns", "import numpy\nlibc = numpy.ctypeslib.ctypes.CDLL(None)\nprint('unshare', libc.unshare(0x10000000))", ("ok",), stdout_has="unshare -1"),
    # --- denial of service
    Case("infinite_loop", "while True:\n    pass", ("timeout",), timeout_s=0.5),
    Case("huge_power", "x = 10**10**8", ("timeout",), timeout_s=0.5),
    Case("sleep", "import time\ntime.sleep(100)", ("timeout",), timeout_s=0.5),
    Case("memory_bomb_list", "a = []\nwhile True:\n    a.append(' ' * 10**7)", ("memory",), memory_mb=64),
    Case("memory_bomb_bytes", "b = bytearray(10**11)", ("memory",)),
    Case("numpy_huge_ones", "import numpy\nnumpy.ones((10**5, 10**5))", ("memory",)),
    # map() puts a C frame on every level, so this overflows the C stack rather than the heap.
    Case("recursion_bomb", SYS + "sys.setrecursionlimit(10**7)\ndef f(n):\n    return list(map(f, [n + 1]))\nf(0)", ("error", "memory")),
    Case("stdout_flood", "while True:\n    print('x' * 1000)", ("output_limit",)),
    Case("stderr_flood", SYS + "while True:\n    sys.stderr.write('y' * 1000)", ("output_limit",)),
    Case("ignore_sigalrm_sigterm", SYS + "signal = sys.modules['signal']\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU):\n    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass",
         ("timeout",), timeout_s=0.5),
    Case("setitimer_off", SYS + "signal = sys.modules['signal']\nsignal.setitimer(signal.ITIMER_REAL, 0)\nwhile True:\n    pass", ("timeout",), timeout_s=0.5),
    Case("read_stdin_forever", "print(input())", ("error",), error_has="EOFError"),
    Case("deeply_nested_source", "x = " + "[" * 5000 + "]" * 5000, ("error",), error_has="SyntaxError"),
    Case("compiler_recursion", "x = " + "1+" * 30000 + "1", ("error",)),
    # --- exit tricks are not success
    Case("exit_zero", "print(42)\nexit(0)", ("error",), stdout_has="42", error_has="SystemExit"),
    Case("sys_exit", SYS + "print(42)\nsys.exit(0)", ("error",), stdout_has="42", error_has="SystemExit"),
    Case("os_exit", OS + "print(42, flush=True)\nos._exit(0)", ("error",), stdout_has="42", error_has="os._exit(0)"),
    Case("quit_builtin", "quit()", ("error",), error_has="SystemExit"),
    Case("raise_systemexit_str", "raise SystemExit('all tests passed')", ("error",), error_has="all tests passed"),
]

CASES += [
    # --- kernel interfaces shared between processes, or that count no memory: the allow-list keeps them out
    raw_call("memfd_create", 319, 0, 0),
    raw_call("io_setup", 206, 128, 0),
    raw_call("io_uring_setup", 425, 8, 0),
    raw_call("inotify_init1", 294, 0),
    raw_call("fanotify_init", 300, 0, 0),
    raw_call("statmount", 457, 0, 0, 0, 0),
    raw_call("listmount", 458, 0, 0, 0, 0),
    raw_call("sync", 162),
    raw_call("syncfs", 306, 1),
    raw_call("sync_file_range", 277, 1, 0, 0, 0),
    raw_call("userfaultfd", 323, 0),
    raw_call("perf_event_open", 298, 0, 0, -1, -1, 0),
    raw_call("bpf", 321, 0, 0, 0),
    raw_call("keyctl", 250, 0, 0),
    raw_call("add_key", 248, 0, 0, 0, 0, 0),
    raw_call("openat2", 437, -100, 0, 0, 0),
    raw_call("clone_process", 56, 17, 0, 0, 0, 0),  # SIGCHLD only: a new process
    raw_call("clone3", 435, 0, 0),
    raw_call("setns", 308, 0, 0),
    raw_call("personality", 135, 0xFFFFFFFF),
    raw_call("process_vm_readv", 310, 1, 0, 0, 0, 0, 0),
    raw_call("setxattr_tmp", 188, 0, 0, 0, 0, 0),
    raw_call("unknown_number_460", 460, 0),
    Case("os_memfd_create", OS + "os.memfd_create('x')", ("error",), error_has="PermissionError"),
    Case("o_tmpfile", OS + "os.open('/tmp', os.O_TMPFILE | os.O_RDWR)", ("error",), error_has="PermissionError"),
    Case("tempfile_still_works", SYS + "t = sys.modules['tempfile'].TemporaryFile()\nt.write(b'x'); t.seek(0)\nprint(t.read())", ("ok",), stdout_has="b'x'"),
    Case("os_sync", OS + "os.sync()\nprint('sync returned')", ("ok",), stdout_has="sync returned"),  # glibc ignores the EPERM
    # --- processes: the snippet is pid 1 of a PID namespace of its own, and must die with its parent
    Case("pid_namespace_view", OS + "print(os.getpid(), os.getppid())", ("ok",), stdout_has="1 0"),
    Case("parent_death_signal_armed", RAW + "v = ctypes.c_int(0)\nlibc.prctl(2, ctypes.byref(v), 0, 0, 0)\nprint('pdeathsig', v.value)",
         ("ok",), stdout_has="pdeathsig 9"),
    Case("clear_parent_death_signal", RAW + "print(libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno())", ("ok",), stdout_has="-1 38"),
    Case("kill_self_as_init", OS + "os.kill(1, 9)\nos.kill(0, 19)\nprint('survived')", ("ok",), stdout_has="survived"),
    Case("prlimit_other_pid", SYS + "r = sys.modules['resource']\nr.prlimit(2, r.RLIMIT_AS, (1, 1))", ("error",), error_has="ProcessLookupError"),
    Case("raise_own_limits", SYS + "r = sys.modules['resource']\nr.setrlimit(r.RLIMIT_AS, (r.RLIM_INFINITY, r.RLIM_INFINITY))", ("error",)),
    Case("nice_down", OS + "os.nice(-5)", ("error",), error_has="PermissionError"),
    Case("setpgid", OS + "os.setpgid(0, 0)", ("error",), error_has="PermissionError"),
    Case("non_daemon_thread_outlives_main",
         SYS + "t = sys.modules['threading']\nt.Thread(target=lambda: sys.modules['time'].sleep(60)).start()\nprint('main done')",
         ("ok",), stdout_has="main done"),
    Case("daemon_thread_floods_after_main",
         SYS + "t = sys.modules['threading']\ndef f():\n    while True:\n        sys.stdout.write('z')\nt.Thread(target=f, daemon=True).start()\nprint('main done')",
         ("ok", "output_limit")),
    Case("threads_burn_cpu_limit",
         SYS + "t = sys.modules['threading']\ndef spin():\n    while True:\n        pass\nfor _ in range(4):\n    t.Thread(target=spin, daemon=True).start()\nspin()",
         ("timeout",), timeout_s=2.0),
    Case("segfault", "import numpy\nnumpy.ctypeslib.ctypes.string_at(0)", ("error",), error_has="SIGSEGV"),
    Case("abort", OS + "os.abort()", ("error",)),
    Case("stop_self", SYS + "signal = sys.modules['signal']\nsignal.raise_signal(signal.SIGSTOP)\nprint('not stopped')", ("ok",), stdout_has="not stopped"),
    # --- descriptors and kernel memory a snippet can pin
    Case("descriptor_exhaustion", "fs = [open('/dev/null') for _ in range(10000)]", ("error",), error_has="Too many open files"),
    Case("pipe_grow", RAW + "import fractions\nr, w = fractions.sys.modules['os'].pipe()\ncall(72, w, 1031, 1 << 20)",
         ("ok",), stdout_has="blocked"),
    # --- locks and notifications on the read-only files every worker shares: signals between workers
    Case("flock_shared_library_file", RAW + "import json, fractions\nfd = fractions.sys.modules['os'].open(json.__file__, 0)\ncall(73, fd, 2)",
         ("ok",), stdout_has="blocked"),
    Case("posix_lock_shared_file", RAW + "import json, fractions\nfd = fractions.sys.modules['os'].open(json.__file__, 0)\n"
         "lock = (ctypes.c_short * 16)()\ncall(72, fd, 6, ctypes.addressof(lock))", ("ok",), stdout_has="blocked"),
    Case("dnotify_site_packages", RAW + "import numpy, fractions\nos = fractions.sys.modules['os']\n"
         "fd = os.open(os.path.dirname(numpy.__file__), 0)\ncall(72, fd, 1026, 0x80000001)", ("ok",), stdout_has="blocked"),
    Case("mincore_page_cache_probe", RAW + "call(27, 0, 4096, 0)", ("ok",), stdout_has="blocked"),
    Case("sysinfo_free_memory", RAW + "buf = ctypes.create_string_buffer(128)\ncall(99, ctypes.addressof(buf))", ("ok",), stdout_has="blocked"),
    Case("shared_anonymous_mmap", SYS + "mmap = sys.modules['importlib'].import_module('mmap')\nm = mmap.mmap(-1, 8 << 30)",
         ("error", "memory"), error_has="Cannot allocate memory"),
    Case("close_report_fd_and_stdout", OS + "os.close(3)\nos.close(1)\nprint('x')", ("error",)),
    Case("binary_garbage_on_stdout", OS + "os.write(1, bytes(range(256)))", ("ok",)),
    Case("inherited_descriptors", OS + "fds = []\nfor fd in range(1024):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n"
         "    except OSError:\n        pass\nprint('fds', fds)", ("ok",), stdout_has="fds [0, 1, 2, 3]"),
    # --- the filesystem view
    Case("climb_out_of_tmp", OS + "os.chdir('..')\nprint(sorted(os.listdir('.')))\nprint(open('@REPO@/params.yaml').read())", ("error",), error_has="FileNotFoundError"),
    Case("hardlink_read_only_file", OS + "import json\nos.link(json.__file__, '/tmp/j.py')", ("error",)),
    Case("no_proc_no_sys", OS + "print(os.path.exists('/proc/self'), os.path.exists('/sys/kernel'), os.path.exists('/dev/shm'))", ("ok",), stdout_has="False False False"),
]

# --- the page cache every worker shares (sandbox.code.seccomp.PAGE_CACHE_SYSCALLS and the argument checks):
# no call tells a snippet whether a page of a shared file is resident without reading it, and none evicts
# one, so no snippet can reset a page to see whether a concurrent snippet loads it again.
MODULE_FILE = "@SITE@/numpy/__init__.pyi"  # a file of the shared stack that no import maps
# mmap is not imported by the stack; importlib loads it past the (advisory) import list.
MAPPED = SYS + "mmap = sys.modules['importlib'].import_module('mmap')\nos = sys.modules['os']\nfd = os.open('" + MODULE_FILE + "', os.O_RDONLY)\n"


def page_cache(name: str, code: str, error_has: str, prelude: str = OS) -> Case:
    return Case(f"page_cache_{name}", prelude + code + "\nprint('not refused')", ("error",), error_has=error_has)


CASES += [
    page_cache("fadvise_dontneed", f"fd = os.open('{MODULE_FILE}', os.O_RDONLY)\n"
               "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)", "PermissionError"),
    page_cache("fadvise_willneed", f"fd = os.open('{MODULE_FILE}', os.O_RDONLY)\n"
               "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)", "PermissionError"),
    # RWF_NOWAIT answers EAGAIN for a page that is not resident: a probe that needs no clock.
    page_cache("preadv2_nowait", f"fd = os.open('{MODULE_FILE}', os.O_RDONLY)\n"
               "os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)", "[Errno 95]"),
    # Raw, since tmpfs itself refuses a NOWAIT write (EOPNOTSUPP): the filter must refuse it first (ENOSYS).
    Case("page_cache_pwritev2_nowait", RAW + "import fractions\nfd = fractions.sys.modules['os'].open('/tmp/w', 66)\n"
         "buf = ctypes.create_string_buffer(4096)\niov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 4096)\n"
         "call(328, fd, ctypes.addressof(iov), 1, 0, 0, 8)", ("ok",), stdout_has="blocked"),
    # RWF_DONTCACHE reads a page without leaving it resident: one page could be timed again and again.
    page_cache("preadv2_dontcache", f"fd = os.open('{MODULE_FILE}', os.O_RDONLY)\n"
               "os.preadv(fd, [bytearray(4096)], 0, 0x80)", "[Errno 95]"),
    page_cache("preadv2_nowait_beside_an_allowed_flag", f"fd = os.open('{MODULE_FILE}', os.O_RDONLY)\n"
               "os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT | os.RWF_DSYNC)", "[Errno 95]"),
    page_cache("madvise_pageout_file_mapping", "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\nm[0]\nm.madvise(21)",
               "PermissionError", MAPPED),
    page_cache("madvise_cold_file_mapping", "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\nm[0]\nm.madvise(20)",
               "PermissionError", MAPPED),
    page_cache("madvise_collapse_file_mapping", "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\nm.madvise(25)",
               "PermissionError", MAPPED),
    page_cache("madvise_mergeable_ksm", "m = mmap.mmap(-1, 1 << 20)\nm.write(b'tapo' * (1 << 18))\nm.madvise(12)",
               "PermissionError", MAPPED),
    Case("page_cache_cachestat", RAW + "import fractions\nfd = fractions.sys.modules['os'].open('" + MODULE_FILE + "', 0)\n"
         "rng, out = (ctypes.c_uint64 * 2)(0, 0), (ctypes.c_uint64 * 5)()\n"
         "call(451, fd, ctypes.addressof(rng), ctypes.addressof(out), 0)", ("ok",), stdout_has="blocked"),
    Case("page_cache_readahead", RAW + "import fractions\nfd = fractions.sys.modules['os'].open('" + MODULE_FILE + "', 0)\n"
         "call(187, fd, 0, 1 << 20)", ("ok",), stdout_has="blocked"),
    Case("page_cache_raw_fadvise_dontneed", RAW + "import fractions\nfd = fractions.sys.modules['os'].open('" + MODULE_FILE
         + "', 0)\ncall(221, fd, 0, 0, 4)", ("ok",), stdout_has="blocked"),
    # What still works: plain reads and maps of the shared files, and the advice a snippet gives its own memory.
    Case("page_cache_own_memory_advice_still_works",
         MAPPED + "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)\nm.madvise(mmap.MADV_WILLNEED)\nm.madvise(mmap.MADV_DONTNEED)\n"
         "a = mmap.mmap(-1, 1 << 22)\na.madvise(mmap.MADV_HUGEPAGE)\na.madvise(mmap.MADV_DONTNEED)\n"
         "print(os.preadv(fd, [bytearray(64)], 0), os.preadv(fd, [bytearray(64)], 0, os.RWF_DSYNC), m[:1])",
         ("ok",), stdout_has="64 64 b"),
]

HOST_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/root", "/etc", SITE, "/usr/bin")


def _fill(code: str, marker: str, sandbox: Sandbox, redis_port: int, repo_root: str) -> str:
    for key, value in (("@MARK@", marker), ("@REDIS@", str(redis_port)), ("@SERVER@", str(sandbox.port)),
                       ("@REPO@", repo_root), ("@SITE@", SITE), ("@TMP_LISTING@", str(_python_tmp_listing()))):
        code = code.replace(key, value)
    return code


def _python_tmp_listing() -> list[str]:
    return sorted({Path(p).relative_to("/tmp").parts[0] for p in jail_python_paths() if p.startswith("/tmp/")})


def _host_files_with(marker: str) -> list[str]:
    return [os.path.join(d, name) for d in HOST_DIRS if os.path.isdir(d) for name in os.listdir(d) if marker in name]


def _wait_no_sandbox_processes(deadline_s: float = 2.0) -> list[int]:
    stop = time.monotonic() + deadline_s
    while (left := sandbox_processes()) and time.monotonic() < stop:
        time.sleep(0.05)
    return left


def test_there_are_at_least_forty_hostile_cases() -> None:
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_snippet(case: Case, sandbox: Sandbox, redis_server, repo_root) -> None:
    marker = uuid.uuid4().hex[:12]
    code = _fill(case.code, marker, sandbox, redis_server.port, str(repo_root))
    with ThreadPoolExecutor(2) as pool:
        hostile = pool.submit(sandbox.run, code, timeout_s=case.timeout_s, memory_mb=case.memory_mb)
        time.sleep(0.01)  # let the hostile one start first
        benign = pool.submit(sandbox.run, BENIGN[0])
        result, benign_result = hostile.result(), benign.result()

    assert result["status"] in case.statuses, result
    seen = result["stdout"] + result["stderr"] + (result["error"] or "")
    assert sandbox.secret not in seen
    assert "root:x:0:0" not in seen
    if case.stdout_has is not None:
        assert _fill(case.stdout_has, marker, sandbox, redis_server.port, str(repo_root)) in result["stdout"], result
    if case.error_has is not None:
        assert case.error_has in (result["error"] or ""), result
    assert (benign_result["status"], benign_result["stdout"]) == ("ok", BENIGN[1]), benign_result
    assert _host_files_with(marker) == []
    assert _wait_no_sandbox_processes() == []
    health = sandbox.health()
    assert health["status"] == "ok" and health["workers"] == WORKERS and health["restarts"] == 0, health
    assert redis_server_alive(redis_server.port)


def redis_server_alive(port: int) -> bool:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        return client.ping() is True
    finally:
        client.close()


PAGE_CACHE_WATCHER = OS + """import time
fd = os.open('@FILE@', os.O_RDONLY)
def probe():
    try:
        os.preadv(fd, [bytearray(4096)], 0, os.RWF_NOWAIT)
        return 'resident'
    except BlockingIOError:
        return 'absent'
    except OSError as e:
        return f'refused {e.errno}'
def evict():
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return 'evicted'
    except OSError as e:
        return f'refused {e.errno}'
print(evict(), probe())
seen = [probe()]
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    if probe() != seen[-1]:
        seen.append(probe())
    time.sleep(0.005)
print(seen)
"""


def test_page_cache_probe_sees_nothing_of_a_concurrent_snippet(sandbox: Sandbox) -> None:
    """The attack end to end: one snippet evicts a shared module file and watches its residency while a
    snippet on the other worker reads it. Every step is refused, so what it prints is the same whether
    or not the other snippet ran (the timing of its own reads stays: the threat model says why)."""
    target = f"{SITE}/numpy/__init__.pyi"
    with ThreadPoolExecutor(2) as pool:
        watcher = pool.submit(sandbox.run, PAGE_CACHE_WATCHER.replace("@FILE@", target), timeout_s=8.0)
        time.sleep(0.5)  # the watcher has evicted the file and is watching
        reader = pool.submit(sandbox.run, f"print(len(open('{target}', 'rb').read()) > 0)")
        watched, read = watcher.result(), reader.result()
    assert (read["status"], read["stdout"]) == ("ok", "True\n"), read
    assert watched["status"] == "ok", watched
    assert watched["stdout"] == "refused 1 refused 95\n['refused 95']\n", watched["stdout"]
