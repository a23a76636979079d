"""Nothing a stage starts outlives it: a watcher process that ends the stage's descendants.

A stage starts processes it does not control the start of (Prefect's temporary API server,
DeepSpeed ranks, vLLM engines) besides the services it does (`pipeline.services.processes`, which also
get a parent-death signal). When the stage is killed with SIGKILL nothing in it can run, and
its children are re-parented to init, so the stage cannot clean up after itself. Hence:

* `watch_this_process(anchors)` starts `python -m pipeline.services.reaper`, a small process in its own
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
from pathlib import Path

import psutil

POLL_S = 0.25
GRACE_S = 5.0


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); None when it is gone
    or a zombie. Exact, unlike a start time in seconds, which is derived from a boot time that can drift."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def identity(pid: int) -> str:
    """'<pid>:<start ticks>' of a running process (its start time tells apart a reused pid)."""
    return f"{pid}:{_start_ticks(pid)}"


def watch_this_process(anchors: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start the watcher for this process (see the module); returns its handle."""
    command = [sys.executable, "-m", "pipeline.services.reaper", identity(os.getpid()), *(identity(a) for a in anchors)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None,
                            start_new_session=True, close_fds=True)


def _running(ident: str) -> bool:
    pid, _, ticks = ident.partition(":")
    return _start_ticks(int(pid)) == ticks


def descendants(pid: int) -> set[str]:
    """Identities of the running descendants of `pid` (this watcher left out)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    found = {f"{c.pid}:{_start_ticks(c.pid)}" for c in children if c.pid != os.getpid()}
    return {i for i in found if not i.endswith(":None")}


def _signal(ident: str, sig: int) -> None:
    if _running(ident):
        try:
            os.kill(int(ident.split(":")[0]), sig)
        except OSError:
            pass


def end_all(idents: set[str], grace_s: float = GRACE_S, *, children: bool = True) -> None:
    """SIGTERM every process still running (and its children), SIGKILL what is left after `grace_s`."""
    targets = {i for i in idents if _running(i)}
    if children:
        for ident in list(targets):
            targets |= descendants(int(ident.split(":")[0]))
    for ident in targets:
        _signal(ident, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_running(i) for i in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    for ident in targets:
        _signal(ident, signal.SIGKILL)


def watch(stage: str, anchors: list[str]) -> None:
    """Note the stage's descendants until it (or an anchor) ends; then end them (see the module)."""
    noted: set[str] = set()
    stage_pid = int(stage.split(":")[0])
    while _running(stage):
        noted |= descendants(stage_pid)
        if not all(_running(a) for a in anchors):  # e.g. the dvc repro above the stage was killed
            end_all({stage}, grace_s=2 * GRACE_S, children=False)  # the stage first: it cleans up
            break
        time.sleep(POLL_S)
    end_all(noted)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the stage must not stop its watcher
    stage, *anchors = sys.argv[1:]
    watch(stage, anchors)


if __name__ == "__main__":
    main()
