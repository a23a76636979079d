"""Memory and task limits from a cgroup v2 delegated to the service, where there is one.

RLIMIT_AS counts a snippet's anonymous and mapped memory but not memfd or tmpfs pages; a
cgroup's `memory.max` counts everything charged to it, page cache and tmpfs included. So
where the service can use a cgroup of its own, each worker slot gets one leaf cgroup
`<base>/sandbox-slot-<N>` created here; before each request the worker writes the
request's `memory_mb` into its `memory.max` (and `pids.max` stays at the task cap), and
the child moves itself into it (writing "0" to `cgroup.procs` while still root, before any
snippet code runs). Where no such cgroup exists (these CI hosts, and any cgroup v1 host),
`detect` says why, nothing is written anywhere, and memory stays bounded by rlimits plus
the refusal of memfd (see `sandbox.code.seccomp`).

A cgroup counts as delegated when it is either named by the operator (`--cgroup PATH`, a
cgroup v2 directory made for this service, holding no processes) or is the service's own
cgroup (from /proc/self/cgroup) on a unified hierarchy, writable by it, with no process in
it but this one. Writes go only to: the delegated directory's `cgroup.subtree_control`
(enabling memory and pids for the slots), for the own-cgroup case a `sandbox-server` leaf
created here that the server moves itself into first (cgroup v2 lets only leaves hold
processes), and the slot cgroups created here. `remove` deletes the slot cgroups at shutdown
(the server's own leaf, which still holds it, and the enabled controllers stay: both are
inside the delegation). A slot cgroup that cannot be joined fails the child closed: it exits
before any snippet code runs.
memfd_create stays denied even with a cgroup (defence in depth: it would be counted, but
nothing the allowed packages need uses it).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

MemoryMode = Literal["cgroup2", "rlimit+memfd-denied"]
CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids")
SLOT_PREFIX = "sandbox-slot-"
SERVER_LEAF = "sandbox-server"
CGROUP2_SUPER_MAGIC = 0x63677270
_libc = ctypes.CDLL(None, use_errno=True)


def is_cgroup2_mount(path: str) -> bool:
    """Whether `path` lies on a cgroup2 filesystem (statfs f_type), not a directory that only
    looks like one: limits written to plain files would bound nothing while /health said they did."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field (a long)
    if _libc.statfs(os.fsencode(path), buf) != 0:
        return False
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], "little") == CGROUP2_SUPER_MAGIC


@dataclass(frozen=True)
class Delegation:
    """A cgroup v2 directory the service may create children in."""

    path: str
    own: bool  # the service's own cgroup (so the server must move into a leaf first)


def own_cgroup_dir(proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT) -> str | None:
    """The directory of this process's cgroup v2 (the "0::" line), or None where `root` is not a
    unified (v2) mount: on v1 and hybrid hosts the memory controller belongs to v1."""
    if not os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return None
    try:
        with open(proc_cgroup) as lines:
            for line in lines:
                if line.startswith("0::"):
                    return os.path.join(root, line[3:].strip().lstrip("/"))
    except OSError:
        return None
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _procs(path: str) -> list[int]:
    return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]


def unusable_reason(path: str, own: bool, self_pid: int | None = None) -> str | None:
    """Why `path` cannot be used as a delegated cgroup v2, or None if it can."""
    controllers_file = os.path.join(path, "cgroup.controllers")
    if not os.path.isfile(controllers_file):
        return f"{path} is not a cgroup v2 directory (no cgroup.controllers)"
    available = _read(controllers_file).split()
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"controllers {missing} are not available in {path}"
    for name in ("", "cgroup.subtree_control", "cgroup.procs"):
        if not os.access(os.path.join(path, name), os.W_OK):
            return f"{os.path.join(path, name)} is not writable by the service"
    strangers = [p for p in _procs(path) if p != (self_pid if own else None)]
    if strangers:
        return f"{path} holds processes other than this service ({len(strangers)})"
    return None


def detect(flag_path: str | None, proc_cgroup: str = "/proc/self/cgroup", root: str = CGROUP_ROOT,
           on_cgroupfs: Callable[[str], bool] = is_cgroup2_mount) -> tuple[Delegation | None, str]:
    """The delegated cgroup to use and a sentence on why (or why none)."""
    if flag_path and not on_cgroupfs(flag_path):
        return None, f"--cgroup {flag_path} is not on a cgroup2 filesystem"
    if flag_path:
        reason = unusable_reason(flag_path, own=False)
        return (None, f"--cgroup {reason}") if reason else (Delegation(flag_path, own=False), "named by --cgroup")
    own = own_cgroup_dir(proc_cgroup, root)
    if own is None:
        return None, f"{root} is not a cgroup v2 mount (cgroup v1 or hybrid host): nothing delegated"
    if os.path.realpath(own) == os.path.realpath(root):
        return None, "the service runs in the root cgroup, which it did not create: not touched"
    if not on_cgroupfs(own):
        return None, f"{own} is not on a cgroup2 filesystem"
    reason = unusable_reason(own, own=True, self_pid=os.getpid())
    return (None, reason) if reason else (Delegation(own, own=True), "the service's own writable cgroup")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


@dataclass(frozen=True)
class SlotCgroups:
    """The slot cgroups made under a delegation; `remove` undoes `create`."""

    delegation: Delegation
    slots: int
    tasks: int

    def slot_dir(self, slot: int) -> str:
        return os.path.join(self.delegation.path, f"{SLOT_PREFIX}{slot}")

    def create(self) -> None:
        base = self.delegation.path
        if self.delegation.own:
            os.makedirs(os.path.join(base, SERVER_LEAF), exist_ok=True)
            _write(os.path.join(base, SERVER_LEAF, "cgroup.procs"), str(os.getpid()))
        enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
        wanted = " ".join(f"+{c}" for c in CONTROLLERS if c not in enabled)
        if wanted:
            _write(os.path.join(base, "cgroup.subtree_control"), wanted)
        for slot in range(self.slots):
            path = self.slot_dir(slot)
            os.makedirs(path, exist_ok=True)
            _write(os.path.join(path, "pids.max"), str(self.tasks))
            swap = os.path.join(path, "memory.swap.max")
            if os.path.exists(swap):  # swapped-out pages would otherwise escape memory.max
                _write(swap, "0")

    def remove(self) -> None:
        """Delete the slot cgroups (empty once their snippets are gone); best effort."""
        for slot in range(self.slots):
            try:
                os.rmdir(self.slot_dir(slot))
            except OSError:
                pass


def set_memory_max(memory_max_fd: int, memory_mb: int) -> None:
    """Limit the slot's next snippet (an fd on its memory.max, opened before the jail)."""
    os.pwrite(memory_max_fd, str(memory_mb << 20).encode(), 0)


def join(procs_fd: int) -> None:
    """Move the calling process into the cgroup whose cgroup.procs `procs_fd` is."""
    os.pwrite(procs_fd, b"0", 0)
