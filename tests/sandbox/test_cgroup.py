"""Memory mode: a delegated cgroup v2 where there is one, rlimits plus memfd denied where not.

The detection and the create/limit/move/cleanup mechanics run against temporary directories
laid out like cgroup v2 directories (the kernel's files as plain files), so they are tested
on every host. The real-service tests check what `/health` says on this host and, only
where a writable cgroup v2 delegation exists (named by TAPO_SANDBOX_CGROUP, an empty cgroup
v2 directory made for the test), that a tmpfs file beyond memory_mb fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from pipeline.services.processes import free_port, python_service
from sandbox.code import cgroup
from tests.sandbox.support import UID_BASE, Sandbox


def _cgroup_dir(path: Path, controllers: str = "cpu memory pids", subtree: str = "", procs: str = "") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in (("cgroup.controllers", controllers), ("cgroup.subtree_control", subtree),
                       ("cgroup.procs", procs), ("memory.max", "max"), ("pids.max", "max")):
        (path / name).write_text(text)
    return path


def _host(tmp_path: Path, own: str = "/svc", **layout) -> tuple[Path, Path, Path]:
    root = _cgroup_dir(tmp_path / "root")
    service = _cgroup_dir(root / own.strip("/"), **layout) if own.strip("/") else root
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, service, proc


def _detect(tmp_path: Path, flag: str | None = None, **host) -> tuple[cgroup.Delegation | None, str]:
    root, _, proc = _host(tmp_path, **host)
    return cgroup.detect(flag, proc_cgroup=str(proc), root=str(root), on_cgroupfs=_laid_out)


def _laid_out(path: str) -> bool:
    """Stands in for the statfs check: these directories are cgroups in layout only."""
    return True


def test_a_v1_only_host_has_no_delegation(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("9:memory:/\n8:pids:/\n1:name=systemd:/\n")
    delegation, _ = cgroup.detect(None, proc_cgroup=str(proc), root=str(_cgroup_dir(tmp_path / "root")),
                                  on_cgroupfs=_laid_out)
    assert delegation is None and cgroup.own_cgroup_dir(str(proc), str(tmp_path / "root")) is None


def test_a_hybrid_host_has_no_delegation(tmp_path: Path) -> None:
    """A "0::" line, but /sys/fs/cgroup holds v1 mounts: the memory controller is v1's."""
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job\n0::/\n")
    (tmp_path / "root" / "unified").mkdir(parents=True)
    delegation, reason = cgroup.detect(None, proc_cgroup=str(proc), root=str(tmp_path / "root"),
                                       on_cgroupfs=_laid_out)
    assert delegation is None and "not a cgroup v2 mount" in reason


def test_the_root_cgroup_is_never_used(tmp_path: Path) -> None:
    delegation, reason = _detect(tmp_path, own="/")
    assert delegation is None and "root cgroup" in reason


@pytest.mark.parametrize(("layout", "why"), [
    ({"controllers": "cpu io"}, "not available"),
    ({"controllers": "memory"}, "not available"),
    ({"procs": "1\n"}, "other than this service"),
])
def test_an_own_cgroup_that_cannot_be_used_is_left_alone(tmp_path: Path, layout: dict, why: str) -> None:
    delegation, reason = _detect(tmp_path, **layout)
    assert delegation is None and why in reason
    service = tmp_path / "root" / "svc"
    assert sorted(p.name for p in service.iterdir()) == sorted(
        ["cgroup.controllers", "cgroup.subtree_control", "cgroup.procs", "memory.max", "pids.max"])
    assert (service / "cgroup.subtree_control").read_text() == ""


def test_a_v1_directory_is_not_a_delegation(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "cgroup.procs").write_text("")
    assert cgroup.unusable_reason(str(tmp_path / "v1"), own=False) is not None


def test_the_service_own_writable_cgroup_is_detected(tmp_path: Path) -> None:
    delegation, _ = _detect(tmp_path, procs=f"{os.getpid()}\n")
    assert delegation == cgroup.Delegation(str(tmp_path / "root" / "svc"), own=True)


def test_a_flag_names_the_delegation_and_must_be_v2(tmp_path: Path) -> None:
    named = _cgroup_dir(tmp_path / "delegated")
    assert cgroup.detect(str(named), on_cgroupfs=_laid_out)[0] == cgroup.Delegation(str(named), own=False)
    assert cgroup.detect(str(tmp_path / "missing"), on_cgroupfs=_laid_out)[0] is None


def test_a_directory_that_only_looks_like_a_cgroup_is_refused(tmp_path: Path) -> None:
    """Limits written to plain files bound nothing: the real check reads the filesystem type."""
    named = _cgroup_dir(tmp_path / "lookalike")
    delegation, reason = cgroup.detect(str(named))
    assert delegation is None and "not on a cgroup2 filesystem" in reason
    assert not cgroup.is_cgroup2_mount(str(tmp_path)) and not cgroup.is_cgroup2_mount("/proc")


@pytest.mark.parametrize("own", [False, True])
@pytest.mark.parametrize("enabled", ["", "memory", "memory pids"])
def test_slots_are_created_limited_and_removed(tmp_path: Path, own: bool, enabled: str) -> None:
    base = _cgroup_dir(tmp_path / "base", subtree=enabled)
    foreign = _cgroup_dir(base / "someone-else")
    slots = cgroup.SlotCgroups(cgroup.Delegation(str(base), own=own), slots=3, tasks=32)
    slots.create()
    missing = " ".join(f"+{c}" for c in cgroup.CONTROLLERS if c not in enabled.split())
    assert (base / "cgroup.subtree_control").read_text() == (missing or enabled)
    for slot in range(3):
        assert Path(slots.slot_dir(slot)).parent == base
        assert (Path(slots.slot_dir(slot)) / "pids.max").read_text() == "32"
    if own:  # cgroup v2 lets only leaves hold processes: the server moves into one it made
        assert (base / cgroup.SERVER_LEAF / "cgroup.procs").read_text() == str(os.getpid())
    assert (foreign / "memory.max").read_text() == "max"  # nothing written outside what it made
    for slot in range(3):  # the kernel owns a cgroup's interface files; rmdir takes them along
        for entry in Path(slots.slot_dir(slot)).iterdir():
            entry.unlink()
    slots.remove()
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == sorted(
        ["someone-else"] + ([cgroup.SERVER_LEAF] if own else []))


def test_memory_max_and_join_write_what_the_kernel_expects(tmp_path: Path) -> None:
    slot = _cgroup_dir(tmp_path / "slot")
    (slot / "memory.max").write_text("")
    fd = os.open(slot / "memory.max", os.O_WRONLY)
    procs = os.open(slot / "cgroup.procs", os.O_WRONLY)
    try:
        cgroup.set_memory_max(fd, 16)
        cgroup.join(procs)
    finally:
        os.close(fd)
        os.close(procs)
    assert (slot / "memory.max").read_text() == str(16 << 20)
    assert (slot / "cgroup.procs").read_text() == "0"  # "0" = the writer itself, whatever its pid namespace


def test_health_reports_the_rlimit_mode_without_a_delegated_cgroup(sandbox: Sandbox) -> None:
    if cgroup.detect(None)[0] is not None:  # the server shares this process's cgroup
        pytest.skip("this host delegates a cgroup v2 to the service; the test covers hosts that delegate nothing")
    memory = sandbox.health()["memory_limit"]
    assert memory["mode"] == "rlimit+memfd-denied" and memory["memfd"] == "denied" and memory["cgroup"] is None
    assert "nothing delegated" in memory["reason"]
    denied = sandbox.run("import os\nos.memfd_create('x')", memory_mb=16)
    assert denied["status"] != "ok"


@pytest.mark.parametrize("named", ["nope", "lookalike"])
def test_a_named_cgroup_that_is_not_delegated_stops_the_server(tmp_path: Path, named: str) -> None:
    if named == "lookalike":
        _cgroup_dir(tmp_path / named)
    service = python_service("bad-cgroup", "sandbox.code", ["--workers", "1", "--cgroup", str(tmp_path / named)],
                             free_port(), tmp_path)
    with pytest.raises(RuntimeError, match="exited with code 2(.|\n)*--cgroup"):
        service.start(timeout_s=60)
    service.stop()


DELEGATED = os.environ.get("TAPO_SANDBOX_CGROUP", "")


@pytest.mark.skipif(not DELEGATED or cgroup.unusable_reason(DELEGATED, own=False) is not None,
                    reason="no writable cgroup v2 delegation on this host (set TAPO_SANDBOX_CGROUP to an empty "
                           "cgroup v2 directory made for the test); this host is cgroup v1 with nothing delegated")
def test_a_delegated_cgroup_bounds_tmpfs_pages_beyond_memory_mb(tmp_path: Path) -> None:
    service = python_service("cgroup-sandbox", "sandbox.code",
                             ["--workers", "1", "--uid-base", str(UID_BASE + 200), "--cgroup", DELEGATED,
                              "--tmp-size-mib", "128"], free_port(), tmp_path).start(timeout_s=120)
    try:
        health = httpx.get(f"{service.url}/health", timeout=10).json()["memory_limit"]
        assert (health["mode"], health["cgroup"]) == ("cgroup2", DELEGATED)
        write = "data = b'x' * (1 << 20)\nwith open('/tmp/f', 'wb') as f:\n    for _ in range({}):\n        f.write(data)\nprint('wrote')"
        body = {"code": write.format(64), "timeout_s": 10, "memory_mb": 24}
        over = httpx.post(f"{service.url}/run", json=body, timeout=60).json()
        assert over["status"] != "ok" and "wrote" not in over["stdout"], over
        under = httpx.post(f"{service.url}/run", json={**body, "code": write.format(4)}, timeout=60).json()
        assert under["stdout"] == "wrote\n", under
    finally:
        service.stop()
    assert not [p for p in Path(DELEGATED).iterdir() if p.is_dir() and p.name.startswith(cgroup.SLOT_PREFIX)]
