"""Operating-system isolation primitives for the code sandbox (Linux, via ctypes).

Two halves:

* `enter_worker_jail` runs once per worker, as root, before any request: private mount and
  IPC namespaces and a network namespace that holds only a (down) loopback device, then a
  `pivot_root` into a fresh tmpfs that shows only what an interpreter needs, read-only:
  /usr, /lib*, the Python prefix and the virtualenv's site-packages, a minimal /dev, an
  empty /etc, and a size-limited writable /tmp. No /proc, /sys, /home, /root contents,
  project sources or host /tmp exist in that view. CPython 3.11 has no `os.unshare`,
  `mount` or `pivot_root`, hence ctypes.
* `lock_down_child` runs in every forked request process: rlimits, a per-slot
  unprivileged uid, then death with its parent (armed after the uid change, which clears
  it), and a seccomp filter (built once per worker by `sandbox.code.seccomp`) loaded with
  one prctl call. What fork passes on unchanged (no_new_privs, not dumpable, an armed CPU
  limit, SIGXFSZ ignored) is set once in the worker by `prepare_worker_process`, because
  per-request work is the service's cost.
* PID namespaces: `unshare_pid_namespace` (once, so the zygote is pid 1 of the worker's)
  and `new_pid_namespace_for_children` (before every fork of a request process, so each
  is pid 1 of its own).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import signal
from dataclasses import dataclass
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_NOATIME = 1, 2, 4, 8, 1024
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_GET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 2, 4, 38

JAIL_TMP = "/tmp"
# Where the new root is assembled: a tmpfs mounted over the host's /mnt inside the worker's
# private mount namespace, so nothing is created or changed on the host.
_STAGING = "/mnt"
_DEVICES = ("null", "zero", "random", "urandom")
_SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")


class JailError(RuntimeError):
    """The worker could not build its isolation; the server refuses to serve without it."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise JailError(f"{what} failed: {os.strerror(err)} (errno {err})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731 - local shorthand
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies, so no worker or snippet outlives the server."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def mount_tmpfs(target: str, size_mib: int) -> None:
    """A private writable scratch space: size- and inode-limited, nothing in it can be executed, and
    no access times (reading it changes nothing the next request could see)."""
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME,
           f"size={size_mib}m,mode=1777,nr_inodes={TMP_INODES}")


TMP_INODES = 4096


@dataclass(frozen=True)
class TmpState:
    """What a fresh /tmp looks like to `tmp_is_pristine`: every way a snippet can leave something
    behind (a file, a directory, an xattr, a used inode) changes one of these."""

    free_inodes: int
    free_blocks: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int


def tmp_state() -> TmpState:
    fs, info = os.statvfs(JAIL_TMP), os.stat(JAIL_TMP)
    return TmpState(fs.f_ffree, fs.f_bfree, info.st_atime_ns, info.st_mtime_ns, info.st_ctime_ns)


def wipe_tmp(size_mib: int) -> TmpState:
    """Replace the jail's /tmp with an empty tmpfs (faster and surer than deleting files, and it
    resets the inode counter, so a snippet cannot learn how many files earlier ones made).
    Returns the fresh state, against which the next request's leftovers are judged."""
    _check(_libc.umount2(JAIL_TMP.encode(), MNT_DETACH), f"umount {JAIL_TMP}")
    mount_tmpfs(JAIL_TMP, size_mib)
    _restore_python_under_tmp(Path("/"))
    return tmp_state()


# A Python installation that lives under /tmp (say a checkout cloned there) would be hidden
# by the snippet's private /tmp: it is also bound read-only under _HIDDEN, outside /tmp, and
# bound back on top of every fresh /tmp from there (the host's copy is gone after pivot_root).
# The directories leading to it are root's, mode 0755 whatever the umask, so no snippet can
# write beside it; and whether /tmp needs wiping is decided by `TmpState`, never by names.
_HIDDEN = ".python-under-tmp"
_python_under_tmp: tuple[str, ...] = ()


def _restore_python_under_tmp(root: Path) -> None:
    for path in _python_under_tmp:
        target = root / path.lstrip("/")
        _make_root_dirs(root / JAIL_TMP.lstrip("/"), target)
        _bind_read_only(str(root / _HIDDEN / path.lstrip("/")), str(target))


def _make_root_dirs(base: Path, target: Path) -> None:
    """mkdir -p below `base` with mode 0755 regardless of the umask (Path.mkdir applies it)."""
    current = base
    for part in target.relative_to(base).parts:
        current = current / part
        if not current.exists():
            current.mkdir()
        os.chmod(current, 0o755)


def _bind_read_only(source: str, target: str) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    # A bind mount keeps the source's flags; read-only needs a second, remount pass.
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)


def _mirror_path(root: Path, source: str) -> None:
    """Expose `source` at the same absolute path under `root`: a symlink stays a symlink."""
    target = root / source.lstrip("/")
    if os.path.islink(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.is_symlink():
            target.symlink_to(os.readlink(source))
        return
    if not os.path.isdir(source) or target.exists():
        return
    target.mkdir(parents=True, exist_ok=True)
    _bind_read_only(source, str(target))


def _populate_dev(root: Path) -> None:
    dev = root / "dev"
    dev.mkdir()
    for name in _DEVICES:
        node = dev / name
        node.touch()
        # Writable (writing to these devices is harmless and common) but never executable;
        # not nodev, or they would stop being devices.
        _mount(f"/dev/{name}", str(node), None, MS_BIND)
        _mount(None, str(node), None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC)
    (dev / "fd").symlink_to("/proc/self/fd")  # dangling (no /proc): harmless, keeps paths familiar


@dataclass(frozen=True)
class JailLayout:
    """What the worker's root shows: system dirs plus these read-only paths (same absolute path)."""

    python_paths: tuple[str, ...]
    tmp_size_mib: int


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def isolation_unavailable_reason() -> str | None:
    """None if this process could build a worker jail, else why not (probed in a throwaway child)."""
    if os.geteuid() != 0:
        return "not running as root"
    if not os.path.isdir(_STAGING):
        return f"{_STAGING} does not exist"
    pid = os.fork()
    if pid == 0:  # the probe must not change this process's namespaces
        try:
            _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            _mount("tmpfs", _STAGING, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
        except JailError:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "root, but creating namespaces or mounts is not permitted (a container without CAP_SYS_ADMIN?)"
    return None


def _pivot_root(new_root: str) -> None:
    os.chdir(new_root)
    # pivot_root(".", ".") stacks the old root under the new one; unmounting it lazily leaves
    # only the new tree reachable. No wrapper in glibc, hence the raw syscall.
    nr = 155 if os.uname().machine == "x86_64" else 41  # 41 on aarch64
    _check(int(_libc.syscall(ctypes.c_long(nr), b".", b".")), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def enter_worker_jail(layout: JailLayout) -> None:
    """Move the calling (root, single-threaded) process into its own namespaces and root."""
    if not os.path.isdir(_STAGING):
        raise JailError(f"{_STAGING} must exist: the jail's root is assembled on a tmpfs mounted over it")
    _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates to the host
    _mount("tmpfs", _STAGING, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    root = Path(_STAGING)
    global _python_under_tmp
    _python_under_tmp = tuple(p for p in layout.python_paths if p.startswith(JAIL_TMP + "/"))
    for path in (*_SYSTEM_DIRS, *layout.python_paths):
        _mirror_path(root, path)
    for path in _python_under_tmp:
        _mirror_path(root / _HIDDEN, path)
    _populate_dev(root)
    (root / "etc").mkdir(exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    mount_tmpfs(str(root / "tmp"), layout.tmp_size_mib)
    _restore_python_under_tmp(root)
    _mount(None, _STAGING, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _pivot_root(_STAGING)


@dataclass(frozen=True)
class ChildLimits:
    """Per-request resource limits, computed by the worker before it forks."""

    cpu_s: int
    address_space_bytes: int
    file_size_bytes: int
    open_files: int
    tasks: int


def apply_rlimits(limits: ChildLimits) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.address_space_bytes, limits.address_space_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    # Counted per real uid; each worker slot has its own uid, so this bounds threads per request.
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.tasks, limits.tasks))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))


def drop_privileges(uid: int) -> None:
    """Become `uid` for good: no groups, real = effective = saved ids, so no way back."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def load_seccomp(program: ctypes.Structure) -> None:
    """Install a pre-built BPF program (a `sock_fprog`); no_new_privs is inherited from the worker."""
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0), "seccomp")


# Far beyond any worker's life, yet finite: a finite RLIMIT_CPU arms the kernel's process CPU
# timer, and a child forked from an armed process inherits it armed. Arming it afresh in every
# child costs 0.2-1.4 ms here (most of the lock-down); lowering an armed one costs ~2 us.
_WORKER_CPU_LIMIT_S = 10**9


def prepare_worker_process() -> None:
    """Settings every child inherits through fork, made once in the worker instead of per request."""
    # Past RLIMIT_FSIZE a write should fail with EFBIG (a clear OSError), not kill silently.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    prctl(PR_SET_DUMPABLE, 0)  # no ptrace by the same uid, no core files
    prctl(PR_SET_NO_NEW_PRIVS, 1)  # the worker never execs; seccomp needs it in the children
    resource.setrlimit(resource.RLIMIT_CPU, (_WORKER_CPU_LIMIT_S, _WORKER_CPU_LIMIT_S))


def parent_death_signal() -> int:
    value = ctypes.c_int(0)
    _check(_libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0), "prctl(PR_GET_PDEATHSIG)")
    return value.value


def lock_down_child(limits: ChildLimits, uid: int | None, program: ctypes.Structure) -> None:
    """Everything between fork and the snippet's first instruction, in this order on purpose:
    rlimits while still privileged (raising is impossible afterwards), then the uid, then the
    parent-death signal (the kernel clears it on every uid change, so arming it earlier is a
    no-op), then the filter last because it forbids calls that come before it. Dumpable=0,
    no_new_privs and SIGXFSZ ignored are inherited from the worker (`prepare_worker_process`);
    dropping the uid also resets dumpable to the kernel's suid_dumpable default."""
    apply_rlimits(limits)
    if uid is not None:
        drop_privileges(uid)
    die_with_parent()
    if parent_death_signal() != signal.SIGKILL:
        raise JailError("the parent-death signal did not survive the lock-down")
    load_seccomp(program)


def _syscall(name: str, *args: int) -> int:
    numbers = {"x86_64": {"setns": 308, "pidfd_open": 434}, "aarch64": {"setns": 268, "pidfd_open": 434}}
    nr = numbers[os.uname().machine][name]
    return int(_libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args)))


def new_pid_namespace_for_children(own_pidfd: int) -> None:
    """Make this process's next child the first process (pid 1) of a fresh PID namespace.

    unshare(CLONE_NEWPID) works only while the namespace for children is still the caller's
    own, so it is first reset to that with setns on a pidfd of the caller itself. The child
    sees no other process, and when it dies the kernel kills everything left in its namespace;
    its pid is always 1, so pids carry nothing from one request to the next."""
    _check(_syscall("setns", own_pidfd, CLONE_NEWPID), "setns(CLONE_NEWPID)")
    _unshare(CLONE_NEWPID)


def unshare_pid_namespace() -> None:
    """The next child of this process becomes pid 1 of a new PID namespace (used once, for the zygote)."""
    _unshare(CLONE_NEWPID)
