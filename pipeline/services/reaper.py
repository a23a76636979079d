"""Nothing a stage starts outlives it: a watcher process that ends the stage's descendants.

A stage starts processes it does not control the start of (Prefect's temporary API server,
DeepSpeed ranks, vLLM engines) besides the services it does (`pipeline.services.processes`, which also
get a parent-death signal). When the stage is killed with SIGKILL nothing in it can run, and
its children are re-parented to init, so the stage cannot clean up after itself. Hence:

* `watch_this_process(anchors)` starts `python -m pipeline.services.reaper`, a small process in its own
  session, and marks the stage's environment with a tag of its own (`TAGS_VAR`) that every process the
  stage starts inherits, at any depth. When the stage ends, by any means, the watcher sends SIGTERM to
  every running process that carries the tag (and to their own children), then SIGKILL after `GRACE_S`.
* The tag, not the process tree, says what belongs to the stage: a process whose parent was SIGKILLed
  is re-parented to init (or sits in a session of its own, as torchrun's ranks do), so no walk down
  from the stage finds it, however often one looks. The watcher also notes the stage's descendants
  every `POLL_S` seconds (pid and start time, so a reused pid is never hit), for the rare process
  started with an environment of its own that leaves the tag out.
* `anchors` are processes the stage must not outlive, such as the `dvc repro` above it (which
  starts the stage through a shell): when one of them dies the watcher ends the stage too, so no
  orphaned stage goes on writing outputs that a re-run also writes.
* No parent-death signal on the stage itself: a stage started by hand (under nohup, say) must
  outlive the shell that started it; only the `dvc` process above it is its anchor.
* A process the stage names with `spare(watcher, pid)` (a `dvc exp run` it drives) cleans up after what it
  started itself, and a signal in the middle of that clean-up would cut it short (dvc dies on SIGTERM while
  rewriting its lock table, and every later dvc command there fails on the cut file). So it is not signalled with
  the rest: once the rest has ended it is given `2 * GRACE_S` to end on its own, as after its own child failed,
  and only then ended. The stage names it through the watcher's stdin, one identity a line.
* A process with no watcher of its own (a flow run that a Prefect worker started) gets one for each dvc command
  it runs (`watch_child`): while the command runs, the process is watched as a stage, the command spared.

Only a process that both drops the tag from its environment and is orphaned within one poll of
its parent's death can escape.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

POLL_S = 0.25
GRACE_S = 5.0
TAGS_VAR = "TAPO_PROCESS_TAGS"  # ':'-separated tags; a process started under a tagged one inherits them all


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


def new_tag() -> str:
    return uuid.uuid4().hex


def with_tag(env: Mapping[str, str], tag: str) -> dict[str, str]:
    """`env` with `tag` added to the tags it already carries (a stage inside a stage keeps the outer one's)."""
    tags = [t for t in env.get(TAGS_VAR, "").split(":") if t]
    return dict(env) | {TAGS_VAR: ":".join([*tags, tag])}


def _tags_of(pid: int) -> list[str]:
    """The tags in the environment `pid` was started with (what /proc shows; a process's own later changes to
    its environment do not move it); [] when unreadable."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return []
    prefix = TAGS_VAR.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace").split(":")
    return []


def tagged(tag: str) -> set[str]:
    """Identities of the running processes that carry `tag`, wherever they sit in the process tree (this process
    left out)."""
    found: set[str] = set()
    if not Path("/proc/self/environ").exists():
        return found
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid() and tag in _tags_of(int(entry.name)):
            ident = identity(int(entry.name))
            if not ident.endswith(":None"):
                found.add(ident)
    return found


def watch_this_process(anchors: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start the watcher for this process and tag this process's environment, so that everything it starts from
    now on carries the tag (see the module); returns the watcher's handle."""
    tag = new_tag()
    command = [sys.executable, "-m", "pipeline.services.reaper", tag, identity(os.getpid()),
               *(identity(a) for a in anchors)]
    watcher = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None,
                               start_new_session=True, close_fds=True)
    os.environ[TAGS_VAR] = with_tag(os.environ, tag)[TAGS_VAR]
    return watcher


def watch_child(child: int, tag: str) -> subprocess.Popen:
    """A watcher for one child of a process that has no watcher of its own (a flow run in a Prefect worker):
    should this process die while `child` runs, everything carrying `tag` (the child's environment holds it) and
    everything this process started is ended, `child` spared as by `spare`; once `child` ends, so does the watch,
    ending nothing."""
    command = [sys.executable, "-m", "pipeline.services.reaper", "--while", identity(child), tag,
               identity(os.getpid())]
    watcher = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=None,
                               start_new_session=True, close_fds=True)
    spare(watcher, child)
    return watcher


def spare(watcher: subprocess.Popen, pid: int) -> None:
    """Have `watcher` let `pid` end on its own after the rest of the stage's processes (see the module)."""
    assert watcher.stdin is not None
    try:  # unbuffered: a line a dead watcher could not take must not stay behind, to fail the pipe's close later
        os.write(watcher.stdin.fileno(), f"{identity(pid)}\n".encode())
    except OSError as err:  # the watcher is gone: nothing will end pid before its time either
        print(f"the stage's watcher is gone ({err}): process {pid} is not spared", file=sys.stderr, flush=True)


class Spared:
    """The identities the stage names on this watcher's stdin (read in a thread until the stage is gone)."""

    def __init__(self, lines: Iterable[bytes] = ()) -> None:
        self._found: set[str] = set()
        self._reader = threading.Thread(target=self._read, args=(lines,), daemon=True)
        self._reader.start()

    def _read(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            self._found.add(line.decode().strip())

    def settled(self) -> set[str]:
        """Every identity named, once the stage's end of the pipe is closed (a process it forked without exec may
        keep it open: then what was read within a second)."""
        self._reader.join(timeout=1.0)
        return set(self._found)


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


def end_all(idents: set[str], grace_s: float = GRACE_S, *, children: bool = True,
            keep: frozenset[str] | set[str] = frozenset()) -> None:
    """SIGTERM every process still running (and its children, but those in `keep`), SIGKILL what is left after
    `grace_s`."""
    targets = {i for i in idents if _running(i)}
    if children:
        for ident in list(targets):
            targets |= descendants(int(ident.split(":")[0]))
    targets -= keep
    for ident in targets:
        _signal(ident, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_running(i) for i in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    for ident in targets:
        _signal(ident, signal.SIGKILL)


def end_sparing(idents: set[str], spared: set[str]) -> None:
    """End `idents` but the spared ones; give those `2 * GRACE_S` to end on their own, then end them too."""
    spared = {i for i in spared if _running(i)}
    end_all(idents - spared, keep=spared)
    deadline = time.monotonic() + 2 * GRACE_S
    while any(_running(i) for i in spared) and time.monotonic() < deadline:
        time.sleep(0.05)
    end_all(spared)


def watch(tag: str, stage: str, anchors: list[str], spared: Spared | None = None,
          while_running: str | None = None) -> None:
    """Note the stage's descendants until it (or an anchor) ends; then end them and every process that carries the
    stage's tag, the spared last (see the module). With `while_running`, a watch that ends quietly once that
    process has ended while the stage still runs (`watch_child`)."""
    noted: set[str] = set()
    stage_pid = int(stage.split(":")[0])
    while _running(stage):
        if while_running is not None and not _running(while_running):
            return
        noted |= descendants(stage_pid)
        if not all(_running(a) for a in anchors):  # e.g. the dvc repro above the stage was killed
            end_all({stage}, grace_s=2 * GRACE_S, children=False)  # the stage first: it cleans up
            break
        time.sleep(POLL_S)
    end_sparing(noted | tagged(tag), spared.settled() if spared else set())


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the stage must not stop its watcher
    args, while_running = sys.argv[1:], None
    if args[:1] == ["--while"]:
        while_running, args = args[1], args[2:]
    tag, stage, *anchors = args
    watch(tag, stage, anchors, Spared(sys.stdin.buffer), while_running)


if __name__ == "__main__":
    main()
