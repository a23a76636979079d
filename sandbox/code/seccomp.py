"""The sandbox's seccomp filter, compiled once per worker with libseccomp (ctypes).

An allow-list. `ALLOWED_SYSCALLS` are the calls snippets were measured to make on the real
workloads (numpy, sympy, scipy, mpmath and the rest of the allowed stack, threads, files in
/tmp, stdin, signals and timers, errors and limits: `python -m sandbox.code.syscall_census`),
plus a few that glibc makes on rarer paths. Everything else answers ENOSYS, which libraries
treat as "this kernel lacks it" and fall back from (clone3 -> clone, faccessat2 -> faccessat,
openat2 -> openat). `DENIED_SYSCALLS` answer EPERM instead, so a snippet that tries to create
a process, open a socket, change identity or reach another process reads a plain
PermissionError; they are on no allow-list in any case. Left out on purpose, among others:
io_setup/io_submit and io_uring_* (host-wide aio quota, kernel attack surface), inotify_*
and fanotify_* (watching what other workers' snippets open in the shared site-packages),
listmount/statmount (the mount table), sync/syncfs/sync_file_range, userfaultfd,
perf_event_open, bpf, keyctl/add_key/request_key, memfd_create and memfd_secret (memory that
RLIMIT_AS does not count), System V and POSIX IPC, ptrace and process_vm_*, *xattr setters,
setuid and friends, namespaces and mounts, and personality. Also every call on the page cache of
the shared files (`PAGE_CACHE_SYSCALLS`: mincore, cachestat, fadvise, readahead), which a snippet
could use to see what a concurrent one imports (see the threat model in `sandbox.code`).

Argument checks: `clone` only with CLONE_THREAD (threads yes, processes no); `clone3`
answers ENOSYS so glibc falls back to `clone`; `open`/`openat` never with O_TMPFILE (an
unnamed inode in /tmp that no directory records, so the worker could not tell /tmp was
used); `ioctl` only for the terminal and descriptor queries Python's I/O makes; `fcntl` only for
descriptor flags and duplication (no locks, dnotify, leases or pipe resizing; `flock` is out
too); `madvise` only with advice that acts on the caller's own memory (not COLD, PAGEOUT, MERGEABLE
or COLLAPSE); `preadv2`/`pwritev2` only with the RWF flags that shape a write (not NOWAIT, a
residency probe, or DONTCACHE, a read that leaves no trace); `prctl` only for reading settings
and naming threads. Calls from a foreign ABI (i386
`int 0x80`, x32) kill the process: libseccomp's default for a non-native architecture.

The program is exported as raw BPF once, so each request installs it with a single prctl
instead of recompiling it. `census=True` builds the measurement filter instead: everything
allowed except `DENIED_SYSCALLS` (never used to serve).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Literal

SeccompMode = Literal["allow-list", "census"]
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4
SCMP_CMP_MASKED_EQ = 7
CLONE_THREAD = 0x00010000
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE (O_TMPFILE is this | O_DIRECTORY)

ALLOWED_SYSCALLS = (
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mbind",  # mbind: OpenBLAS
    # descriptors and files (the only writable filesystem is the snippet's private /tmp)
    "read", "write", "pread64", "pwrite64", "readv", "writev", "preadv", "pwritev",
    "close", "close_range", "lseek", "dup", "dup2", "dup3", "fsync", "fdatasync",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2",
    "getdents64", "getcwd", "chdir", "fchdir", "readlink", "readlinkat", "truncate", "ftruncate", "fallocate",
    "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat",
    "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "umask", "utimensat",
    "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    "sendfile", "copy_file_range", "splice", "tee", "pipe", "pipe2",
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait",
    "eventfd2", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    # threads, signals, time
    "futex", "set_robust_list", "get_robust_list", "set_tid_address", "rseq", "gettid", "sched_yield",
    "sched_getaffinity", "sched_getparam", "sched_getscheduler", "sched_get_priority_max", "sched_get_priority_min",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait", "rt_sigsuspend",
    "sigaltstack", "kill", "tgkill", "tkill", "pause", "nanosleep", "clock_nanosleep", "clock_gettime",
    "clock_getres", "gettimeofday", "time", "getitimer", "setitimer", "alarm", "times", "getrusage",
    "restart_syscall", "exit", "exit_group", "wait4", "waitid",
    # identity and limits, read-only (the uid is already dropped; setting them is denied)
    "getpid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
    "getpgrp", "getpgid", "getsid", "getpriority", "getrlimit", "prlimit64", "uname",
    "getrandom", "capget", "arch_prctl", "membarrier",
    # not sysinfo (the host's free memory: a signal between concurrent snippets) nor getcpu
)

# The page cache of the read-only files every worker maps (the Python stack) is one cache for all of them:
# a call that tells whether a page is resident without reading it (mincore, cachestat) or that evicts
# pages (fadvise DONTNEED) lets one snippet watch which modules a concurrent one imports, and loading
# pages on request (readahead, fadvise WILLNEED) is no part of any measured workload. The flag forms of
# the same probes are refused by argument (`preadv2`/`pwritev2` RWF flags, `madvise` advice below).
PAGE_CACHE_SYSCALLS = ("mincore", "cachestat", "fadvise64", "fadvise64_64", "readahead")

DENIED_SYSCALLS = (
    # new processes and programs
    "fork", "vfork", "execve", "execveat",
    # network and IPC endpoints
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "sendto", "sendmsg", "sendmmsg", "recvfrom", "recvmsg", "recvmmsg",
    # System V and POSIX IPC objects outlive the process that made them
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp", "process_madvise",
    # identity
    "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups", "setfsuid", "setfsgid",
    "capset", "setsid", "setpgid", "setpriority", "setrlimit",
    # namespaces, mounts, roots
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount",
    "fsconfig", "fspick", "open_tree", "move_mount", "mount_setattr",
    # kernel attack surface and shared kernel state
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "io_setup", "io_submit", "io_destroy", "io_getevents", "io_pgetevents", "io_cancel",
    "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "syslog",
    "personality", "mknod", "mknodat", "open_by_handle_at", "name_to_handle_at", "acct",
    "quotactl", "lookup_dcookie", "vhangup", "iopl", "ioperm", "uselib", "memfd_secret", "memfd_create",
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_init", "fanotify_mark",
    "sync", "syncfs", "sync_file_range", "listmount", "statmount",
    # the page cache every worker shares (see PAGE_CACHE_SYSCALLS)
    *PAGE_CACHE_SYSCALLS,
    "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
    # clocks and host identity
    "clock_settime", "clock_adjtime", "settimeofday", "adjtimex", "sethostname", "setdomainname",
)

# ioctl requests Python's own I/O makes (isatty, buffer sizing, non-blocking and close-on-exec flags).
_TCGETS, _TIOCGWINSZ, _FIONREAD, _FIONBIO, _FIONCLEX, _FIOCLEX = 0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451
ALLOWED_IOCTLS = (_TCGETS, _TIOCGWINSZ, _FIONREAD, _FIONBIO, _FIONCLEX, _FIOCLEX)
# fcntl commands on descriptors themselves. Not locks (F_SETLK, F_OFD_*, and flock: a lock on a
# shared read-only library file is a signal another worker's snippet can read), not F_NOTIFY
# (dnotify: who opens what in the shared site-packages), not leases, not F_SETPIPE_SZ (kernel
# memory that RLIMIT_AS does not count).
_F_DUPFD, _F_GETFD, _F_SETFD, _F_GETFL, _F_SETFL, _F_DUPFD_CLOEXEC, _F_GETPIPE_SZ = 0, 1, 2, 3, 4, 1030, 1032
ALLOWED_FCNTLS = (_F_DUPFD, _F_GETFD, _F_SETFD, _F_GETFL, _F_SETFL, _F_DUPFD_CLOEXEC, _F_GETPIPE_SZ)
# prctl options that only read state or name a thread.
_PR_GET_PDEATHSIG, _PR_GET_DUMPABLE, _PR_SET_NAME, _PR_GET_NAME, _PR_GET_SECCOMP, _PR_CAPBSET_READ = 2, 3, 15, 16, 21, 23
_PR_GET_NO_NEW_PRIVS, _PR_GET_THP_DISABLE = 39, 42
ALLOWED_PRCTLS = (_PR_GET_PDEATHSIG, _PR_GET_DUMPABLE, _PR_SET_NAME, _PR_GET_NAME, _PR_GET_SECCOMP,
                  _PR_CAPBSET_READ, _PR_GET_NO_NEW_PRIVS, _PR_GET_THP_DISABLE)

# preadv2/pwritev2 flags (RWF_*) that change only how this call writes: DSYNC, SYNC, APPEND, NOAPPEND.
# Not NOWAIT (0x8: EAGAIN unless every page is resident, a page-cache probe that needs no timing), not
# DONTCACHE (0x80: a read that leaves no page behind, so one page can be timed again and again), not HIPRI
# or ATOMIC (direct I/O only), nor any flag a later kernel adds. Refused flags fall to ENOSYS, which
# glibc answers as EOPNOTSUPP, the kernel's own answer to a flag it lacks; without flags both calls work.
_RWF_DSYNC, _RWF_SYNC, _RWF_APPEND, _RWF_NOAPPEND = 0x2, 0x4, 0x10, 0x20
ALLOWED_RWF_FLAGS = _RWF_DSYNC | _RWF_SYNC | _RWF_APPEND | _RWF_NOAPPEND
# madvise advice that acts on the caller's own mappings only. Not COLD (20) or PAGEOUT (21), which push
# a file's pages out of the page cache (newer kernels skip files the caller cannot write; the filter does
# not rely on it), not MERGEABLE (12: KSM merges equal pages across processes, and the copy-on-write
# fault of a merged page reveals by its time what another process holds), not COLLAPSE (25: rebuilds a
# shared file's cached pages as a huge page); those answer EPERM, unknown advice ENOSYS.
ALLOWED_MADVICE = (0, 1, 2, 3, 4, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19, 22, 23, 24, 102, 103)
REFUSED_MADVICE = (12, 20, 21, 25)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


_SCMP_FLTATR_CTL_OPTIMIZE = 8  # libseccomp >= 2.5; older versions ignore it (the filter stays linear)


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def _load_libseccomp() -> ctypes.CDLL:
    path = ctypes.util.find_library("seccomp")
    if path is None:
        raise OSError("libseccomp not found: install the Debian package libseccomp2 (see setup.sh)")
    lib = ctypes.CDLL(path, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    return lib


def _add_rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *conditions: _ArgCmp) -> bool:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # not a syscall on this architecture (e.g. fork on arm64), or unknown to libseccomp
        return False
    array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
    result = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
    if result != 0:
        raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")
    return True


def _add_allow_list(lib: ctypes.CDLL, ctx: int) -> None:
    for name in ALLOWED_SYSCALLS:
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, name)
    for request in ALLOWED_IOCTLS:  # the 32-bit request number: glibc passes it as unsigned long
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, "ioctl", _ArgCmp(1, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, request))
    for command in ALLOWED_FCNTLS:
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, "fcntl", _ArgCmp(1, SCMP_CMP_EQ, command, 0))
    for option in ALLOWED_PRCTLS:
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, "prctl", _ArgCmp(0, SCMP_CMP_EQ, option, 0))
    deny = _errno_action(errno.EPERM)
    for name, flags_arg in (("open", 1), ("openat", 2)):
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, name, _ArgCmp(flags_arg, SCMP_CMP_MASKED_EQ, O_TMPFILE_BIT, 0))
        _add_rule(lib, ctx, deny, name, _ArgCmp(flags_arg, SCMP_CMP_MASKED_EQ, O_TMPFILE_BIT, O_TMPFILE_BIT))
    _add_rule(lib, ctx, SCMP_ACT_ALLOW, "clone", _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD))
    # Both read an int argument, so only its low 32 bits are compared (as the kernel reads them).
    for advice in ALLOWED_MADVICE:
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, "madvise", _ArgCmp(2, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, advice))
    for advice in REFUSED_MADVICE:
        _add_rule(lib, ctx, deny, "madvise", _ArgCmp(2, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF, advice))
    for name in ("preadv2", "pwritev2"):  # flags are the sixth argument (the offset takes two)
        _add_rule(lib, ctx, SCMP_ACT_ALLOW, name, _ArgCmp(5, SCMP_CMP_MASKED_EQ, 0xFFFFFFFF & ~ALLOWED_RWF_FLAGS, 0))


def _compile(lib: ctypes.CDLL, census: bool) -> bytes:
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW if census else _errno_action(errno.ENOSYS))
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        # A binary search over syscall numbers instead of one comparison per rule: every call the
        # snippet makes runs this program, and the allow-list is long.
        lib.seccomp_attr_set(ctx, _SCMP_FLTATR_CTL_OPTIMIZE, 2)
        deny = _errno_action(errno.EPERM)
        for name in DENIED_SYSCALLS:
            _add_rule(lib, ctx, deny, name)
        _add_rule(lib, ctx, deny, "clone", _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
        if census:  # otherwise ENOSYS is the default already (libseccomp refuses a rule that repeats it)
            _add_rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3")
        else:
            _add_allow_list(lib, ctx)
        fd = os.memfd_create("seccomp-bpf")
        try:
            if lib.seccomp_export_bpf(ctx, fd) != 0:
                raise OSError("seccomp_export_bpf failed")
            return os.pread(fd, 1 << 20, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def build_filter(census: bool = False) -> SockFprog:
    """The compiled filter as a `sock_fprog` ready for prctl(PR_SET_SECCOMP). Keep the returned
    object alive: it owns the instruction buffer."""
    code = _compile(_load_libseccomp(), census)
    count = len(code) // ctypes.sizeof(_SockFilter)
    instructions = (_SockFilter * count).from_buffer_copy(code)
    program = SockFprog(count, ctypes.cast(instructions, ctypes.POINTER(_SockFilter)))
    program._instructions = instructions  # type: ignore[attr-defined]  # keeps the buffer alive
    return program
