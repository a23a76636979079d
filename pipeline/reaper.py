"""Nothing a stage starts outlives it: a watcher process that ends the stage's descendants.

A stage starts processes it does not control the start of (Prefect's temporary API server,
DeepSpeed ranks, vLLM engines) besides the services it does (`pipeline.services`, which also
get a parent-death signal). When the stage is killed with SIGKILL nothing in it can run, and
its children are re-parented to init, so the stage cannot clean up after itself. Hence:

* `watch_this_process(anchors)` starts `python -m pipeline.reaper`, a small process in its own
  session that notes the stage's descendants every `POLL_S` seconds (pid and start time, so a
  reused pid is never hit). When the stage ends, by any means, it sends SIGTERM to every noted
  descendant still alive (and to their own children), then SIGKILL after `GRACE_S`.
* `anchors` are processes the stage must not outlive, such as the `dvc repro` above it (which
  starts the stage through a shell): when one of them dies the watcher ends the stage too, so no
  orphaned stage goes on writing outputs that a re-run also writes.
* No parent-death signal on the stage itself: a stage started by hand (under nohup, say) must
  outlive the shell that started it; only the `dvc` process above it is its anchor.

A descendant started and detached within one poll of the stage's death can escape; every
process named above lives for seconds at least.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

POLL_S = 0.25
GRACE_S = 5.0


def identity(pid: int) -> str:
    """'<pid>:<start time>' of a running process (its start time tells apart a reused pid)."""
    return f"{pid}:{psutil.Process(pid).create_time()!r}"


def watch_this_process(anchors: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start the watcher for this process (see the module); returns its handle."""
    command = [sys.executable, "-m", "pipeline.reaper", identity(os.getpid()), *(identity(a) for a in anchors)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None,
                            start_new_session=True, close_fds=True)


def _process(ident: str) -> psutil.Process | None:
    """The running process `ident` names, or None (gone, a zombie, or its pid reused)."""
    pid, started = ident.split(":", 1)
    try:
        proc = psutil.Process(int(pid))
        if repr(proc.create_time()) != started or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def _alive(procs: dict[int, psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:  # is_running checks the start time
                out.append(proc)
        except psutil.Error:
            pass
    return out


def _with_children(procs: list[psutil.Process]) -> dict[int, psutil.Process]:
    found = {p.pid: p for p in procs}
    for proc in procs:
        try:
            found |= {c.pid: c for c in proc.children(recursive=True)}
        except psutil.Error:
            pass
    found.pop(os.getpid(), None)
    return found


def end_all(procs: dict[int, psutil.Process], grace_s: float = GRACE_S, *, children: bool = True) -> None:
    """SIGTERM every process still alive (and its children), SIGKILL what is left after `grace_s`."""
    targets = _alive(_with_children(_alive(procs)) if children else procs)
    for proc in targets:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(targets, timeout=grace_s)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace_s)


def watch(stage: str, anchors: list[str]) -> None:
    """Note the stage's descendants until it (or an anchor) ends; then end them (see the module)."""
    proc = _process(stage)
    noted: dict[int, psutil.Process] = {}
    while proc is not None:
        try:
            noted |= {c.pid: c for c in proc.children(recursive=True)}
        except psutil.Error:
            break
        noted.pop(os.getpid(), None)
        if any(_process(a) is None for a in anchors):  # e.g. the dvc repro above the stage was killed
            end_all({proc.pid: proc}, grace_s=2 * GRACE_S, children=False)  # the stage first: it cleans up
            break
        time.sleep(POLL_S)
        proc = _process(stage)
    end_all(noted)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the stage must not stop its watcher
    stage, *anchors = sys.argv[1:]
    watch(stage, anchors)


if __name__ == "__main__":
    main()
