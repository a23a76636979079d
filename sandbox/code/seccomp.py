"""The sandbox's seccomp filter, compiled once per worker with libseccomp (ctypes).

Default allow, with an errno for every call that creates processes, reaches the network,
changes what the process can see or is, or talks to the kernel's more exotic interfaces.
A deny list (not an allow list) because numpy, sympy and the interpreter use a wide and
version-dependent set of ordinary calls; everything dangerous that an unprivileged uid
could still do is on the list. Calls from a foreign ABI (i386 `int 0x80`, x32) kill the
process: libseccomp's default for a non-native architecture.

`clone` is denied only without CLONE_THREAD, so threads work but processes don't; `clone3`
answers ENOSYS rather than EPERM, which makes glibc fall back to `clone` for threads
(with EPERM, `threading.Thread.start()` fails).

The program is exported as raw BPF once, so each request installs it with a single prctl
instead of recompiling it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
CLONE_THREAD = 0x00010000

DENIED_SYSCALLS = (
    # new processes and programs
    "fork", "vfork", "execve", "execveat",
    # network and IPC endpoints
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "sendto", "sendmsg", "sendmmsg", "recvfrom", "recvmsg", "recvmmsg",
    # System V and POSIX IPC objects outlive the process that made them: a channel between
    # requests, and across workers of the same IPC namespace
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "kcmp", "process_madvise",
    # namespaces, mounts, roots
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsmount",
    "fsconfig", "fspick", "open_tree", "move_mount", "mount_setattr",
    # kernel attack surface rarely needed by numeric code
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "syslog",
    "personality", "mknod", "mknodat", "open_by_handle_at", "name_to_handle_at", "acct",
    "quotactl", "lookup_dcookie", "vhangup", "iopl", "ioperm", "uselib", "memfd_secret",
    # clocks and host identity
    "clock_settime", "clock_adjtime", "settimeofday", "adjtimex", "sethostname", "setdomainname",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


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
    return lib


def _add_rule(lib: ctypes.CDLL, ctx: int, action: int, name: str, *conditions: _ArgCmp) -> bool:
    number = lib.seccomp_syscall_resolve_name(name.encode())
    if number < 0:  # not a syscall on this architecture (e.g. fork on arm64): nothing to deny
        return False
    array = (_ArgCmp * len(conditions))(*conditions) if conditions else None
    result = lib.seccomp_rule_add_array(ctx, action, number, len(conditions), array)
    if result != 0:
        raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")
    return True


def _compile(lib: ctypes.CDLL) -> bytes:
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        deny = _errno_action(errno.EPERM)
        for name in DENIED_SYSCALLS:
            _add_rule(lib, ctx, deny, name)
        _add_rule(lib, ctx, deny, "clone", _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
        _add_rule(lib, ctx, _errno_action(errno.ENOSYS), "clone3")
        fd = os.memfd_create("seccomp-bpf")
        try:
            if lib.seccomp_export_bpf(ctx, fd) != 0:
                raise OSError("seccomp_export_bpf failed")
            return os.pread(fd, 1 << 20, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def build_filter() -> SockFprog:
    """The compiled filter as a `sock_fprog` ready for prctl(PR_SET_SECCOMP). Keep the returned
    object alive: it owns the instruction buffer."""
    code = _compile(_load_libseccomp())
    count = len(code) // ctypes.sizeof(_SockFilter)
    instructions = (_SockFilter * count).from_buffer_copy(code)
    program = SockFprog(count, ctypes.cast(instructions, ctypes.POINTER(_SockFilter)))
    program._instructions = instructions  # type: ignore[attr-defined]  # keeps the buffer alive
    return program
