"""What a stage or a launch started is found by the tag its environment carries, not by walking the process tree:
a process orphaned at any depth, in a session of its own, at any moment (before anyone could have looked) is still
found and ended, and nothing without the tag is touched."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest
from hypothesis import given, strategies as st

from pipeline.services.reaper import TAGS_VAR, end_all, new_tag, tagged, with_tag
from tests.faults.conftest import PYTHON, alive, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads environments through /proc")]

# Each level starts the next and is gone at once (exits, or SIGKILLs itself) without waiting for it, so the leaf is
# orphaned before anything could have noted it as a descendant of anyone.
CHAIN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    depth, new_session, death, out = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3], sys.argv[4]
    if depth == 0:
        with open(out + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(out + ".tmp", out)
        time.sleep(600)
    subprocess.Popen([sys.executable, __file__, str(depth - 1), sys.argv[2], death, out],
                     start_new_session=new_session, stdin=subprocess.DEVNULL)
    if death == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(0)
""")


@pytest.mark.parametrize(("depth", "new_session", "death"),
                         list(itertools.product([1, 3], [False, True], ["exit", "kill"])))
def test_an_orphan_at_any_depth_is_found_by_its_tag_and_ended(tmp_path: Path, depth: int, new_session: bool,
                                                              death: str) -> None:
    script, leaf_file = tmp_path / "chain.py", tmp_path / "leaf.pid"
    script.write_text(CHAIN)
    tag = new_tag()
    top = subprocess.Popen([PYTHON, str(script), str(depth), str(int(new_session)), death, str(leaf_file)],
                           env=with_tag(os.environ, tag), stdin=subprocess.DEVNULL)
    untagged = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL)
    leaf = None
    try:
        top.wait(timeout=120)
        wait_for(leaf_file.is_file, "the chain's leaf")
        leaf = psutil.Process(int(leaf_file.read_text()))
        assert leaf.pid not in {p.pid for p in psutil.Process().children(recursive=True)}  # an orphan now
        found = tagged(tag)
        assert {int(i.split(":")[0]) for i in found} == {leaf.pid}
        end_all(found)
        wait_for(lambda: not alive(leaf), "the tagged orphan to end")
        assert alive(psutil.Process(untagged.pid))  # nothing without the tag is touched
    finally:
        untagged.kill()
        untagged.wait()
        if leaf is not None and alive(leaf):
            leaf.kill()


def test_a_tag_is_matched_whole_not_as_a_prefix(tmp_path: Path) -> None:
    tag = new_tag()
    near = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL,
                            env=os.environ | {TAGS_VAR: f"{tag}0:x{tag}:{tag[:-1]}"})
    try:
        wait_for(lambda: TAGS_VAR.encode() in Path(f"/proc/{near.pid}/environ").read_bytes(), "the process's start")
        assert tagged(tag) == set()
    finally:
        near.kill()
        near.wait()


def test_a_process_does_not_untag_itself_by_changing_its_environment(tmp_path: Path) -> None:
    """/proc shows the environment a process was started with; what it sets or deletes later does not hide it."""
    tag = new_tag()
    code = f"import os, time; os.environ.pop({TAGS_VAR!r}); os.environ[{TAGS_VAR!r}] = 'other'; print(1, flush=True); time.sleep(600)"
    proc = subprocess.Popen([PYTHON, "-c", code], env=with_tag(os.environ, tag), stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"1"
        assert {int(i.split(":")[0]) for i in tagged(tag)} == {proc.pid}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


tags = st.text(alphabet="0123456789abcdef", min_size=1, max_size=8)


@given(st.lists(tags, max_size=4), tags)
def test_tagging_keeps_the_outer_tags(outer: list[str], tag: str) -> None:
    """A stage started inside a tagged one (or a launch inside a stage) carries both tags: ending either ends it."""
    env = {TAGS_VAR: ":".join(outer)} if outer else {}
    assert with_tag(env, tag)[TAGS_VAR].split(":") == [*outer, tag]
    assert with_tag(env, tag) | {TAGS_VAR: ""} == {TAGS_VAR: ""}  # nothing else is added
