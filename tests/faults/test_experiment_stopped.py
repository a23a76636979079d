"""A stopped `python -m flows.experiment` stops its experiment: whatever signal ends the driver (a scheduler's
SIGTERM, a Ctrl-C, an OOM kill), the `dvc exp run` it started, that run's stage and whatever the stage started end
too, the workspace's params.yaml is put back where anything could run, and the next experiment runs in the same
workspace (no lock left held), also when dvc was killed while it wrote its lock table.

Found stopping an experiment arm with `kill <driver>`: its `dvc exp run` went on training, with the sandbox, the
search service and Prefect's server beside it, and params.yaml kept the arm's overrides. Then, once in a while, the
run after a SIGKILLed driver failed on ".dvc/tmp/rwlock ... JSON structure is corrupted": the watcher's SIGTERM had
reached dvc while it rewrote its lock table. Now the watcher ends dvc's stage and lets dvc end on its own
(`flows.common.ends_on_its_own`), and a table cut anyway (an OOM kill) is set aside by the next run."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.dvc_state import GIT_LOCK_PATTERNS, STATE_PATTERNS, DvcStillRunning, broken_state_files, set_aside_broken_state
from tests.faults.conftest import Stage, alive, assert_all_gone, stage_env, wait_for
from tests.orchestration.test_experiment_workspace import sh

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path("/proc/self").exists(), reason="watches processes through /proc (Linux)")]

# With train.steps == 3 (the `long` preset) the stage starts a helper in a session of its own and writes until it
# is stopped; otherwise it records what it saw and ends.
STAGE = """import json, subprocess, sys, time, yaml
p = yaml.safe_load(open("params.yaml"))
if p["train"]["steps"] == 3:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print("started", helper.pid, flush=True)
    with open("out.txt", "a") as out:
        while True:
            out.write("x"); out.flush(); time.sleep(0.02)
json.dump({"epochs": p["sft"]["epochs"]}, open("seen.json", "w"))
"""
DVC_YAML = {"stages": {"see": {"cmd": f"{Path(sys.executable).name} see.py", "params": ["train.steps", "sft.epochs"],
                               "metrics": [{"seen.json": {"cache": False}}]}}}
PRESETS = {"long": {"train": {"steps": 3}}, "short": {"sft": {"epochs": 7}}}
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGKILL: -9}


@pytest.fixture()
def repo(repo_root: Path, tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(repo_root / "params.yaml", repo / "params.yaml")
    (repo / "see.py").write_text(STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    (repo / ".gitignore").write_text("stage-*.log\nout.txt\n")
    presets = repo / "configs" / "experiments"
    presets.mkdir(parents=True)
    for name, changes in PRESETS.items():
        (presets / f"{name}.yaml").write_text(yaml.safe_dump({"extends": "../../params.yaml", **changes}))
    sh(repo, "git", "init", "-q")
    sh(repo, "dvc", "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return repo


def held_locks(repo: Path) -> dict:
    """The entries of dvc's lock table (`{}`: dvc released every lock it took, or took none)."""
    table = repo / ".dvc" / "tmp" / "rwlock"
    held = json.loads(table.read_text()) if table.exists() else {}
    return {kind: entries for kind, entries in held.items() if entries}


def experiment(repo: Path, preset: str) -> Stage:
    env = stage_env(PATH=f"{Path(sys.executable).parent}:{stage_env()['PATH']}")
    return Stage([sys.executable, "-m", "flows.experiment", f"configs/experiments/{preset}.yaml", "--seeds", "0"],
                 repo, env)


@pytest.mark.parametrize("sig", list(EXIT_CODES), ids=lambda s: signal.Signals(s).name)
def test_a_stopped_experiment_leaves_nothing_running_and_the_workspace_usable(repo: Path, sig: int) -> None:
    committed = (repo / "params.yaml").read_bytes()
    driver = experiment(repo, "long")
    try:
        driver.wait_for_line("started")
        helper = psutil.Process(int(driver.output().split("started", 1)[1].split()[0]))
        tree = [*psutil.Process(driver.proc.pid).children(recursive=True), helper]
        assert any("dvc" in " ".join(p.cmdline()) for p in tree if alive(p)), [p.cmdline() for p in tree]
        driver.proc.send_signal(sig)
        assert driver.wait() == EXIT_CODES[sig], driver.output()[-3000:]
        assert_all_gone(tree, f"the experiment of a driver stopped by {signal.Signals(sig).name}")
        written = (repo / "out.txt").stat().st_size
        assert written > 0 and (repo / "out.txt").stat().st_size == written  # nothing writes it any more
        # dvc saw its stage end and released its locks itself (after a SIGKILL too: the watcher spares it)
        assert not broken_state_files(repo), broken_state_files(repo)
        assert held_locks(repo) == {}, held_locks(repo)
    finally:
        driver.kill_all()
    if sig != signal.SIGKILL:  # nothing can run in a SIGKILLed driver: the next run names the keys left instead
        assert (repo / "params.yaml").read_bytes() == committed
    else:
        refused = experiment(repo, "short")
        assert refused.wait() == 1 and "train.steps" in refused.output(), refused.output()[-3000:]
        sh(repo, "git", "checkout", "params.yaml")
    following = experiment(repo, "short")
    try:
        assert following.wait() == 0, following.output()[-3000:]
    finally:
        following.kill_all()
    assert "was left by a dvc killed" not in following.output(), following.output()
    shown = sh(repo, "git", "for-each-ref", "--format=%(refname)", "refs/exps").stdout.split()
    assert [r.rsplit("/", 1)[1] for r in shown if not r.startswith("refs/exps/exec/")] == ["short-s0"]
    wait_for(lambda: (repo / "params.yaml").read_bytes() == committed, "params.yaml put back")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_a_stopped_pipeline_flow_stops_its_dvc_repro_and_dvc_releases_its_locks(repo: Path, sig: int) -> None:
    """`python -m flows.pipeline --dvc` (what a Prefect deployment runs; cancelling its flow run sends SIGTERM)
    runs `dvc repro` as the experiment driver runs `dvc exp run` (`flows.dvc_run`): stopped, it ends, and so
    does everything dvc started, dvc after it released its locks. (It used to wait for dvc repro to finish.)"""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["steps"] = 3  # the stage that writes until it is stopped
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = stage_env(PATH=f"{Path(sys.executable).parent}:{stage_env()['PATH']}")
    flow = Stage([sys.executable, "-m", "flows.pipeline", "--dvc"], repo, env)
    try:
        flow.wait_for_line("started")
        helper = psutil.Process(int(flow.output().split("started", 1)[1].split()[0]))
        tree = [*psutil.Process(flow.proc.pid).children(recursive=True), helper]
        assert any("dvc" in " ".join(p.cmdline()) and "repro" in p.cmdline() for p in tree if alive(p))
        flow.proc.send_signal(sig)
        assert flow.wait() == EXIT_CODES[sig], flow.output()[-3000:]
        assert_all_gone(tree, f"the dvc repro of a pipeline flow stopped by {signal.Signals(sig).name}")
        assert not broken_state_files(repo) and held_locks(repo) == {}, held_locks(repo)
    finally:
        flow.kill_all()


WORKER_FLOW_RUN = "from flows.pipeline import pipeline_flow; pipeline_flow('params.yaml', use_dvc=True)"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_a_deployments_flow_run_killed_mid_repro_stops_its_dvc_repro_too(repo: Path, sig: int, prefect_server: str) -> None:
    """A Prefect worker runs the flow function in a process of its own, outside `stage_process` (no watcher, no
    signal handlers of ours; it reports to the worker's Prefect server). Its `dvc repro` used to run on, orphaned, holding the
    repository's locks until the training ended. Now `run_dvc` gives dvc a watcher of its own
    (`pipeline.services.reaper.watch_child`), and a flow run that ended normally leaves no watcher behind."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["steps"] = 3  # the stage that writes until it is stopped
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = stage_env(PATH=f"{Path(sys.executable).parent}:{stage_env()['PATH']}", PREFECT_API_URL=prefect_server)
    flow = Stage([sys.executable, "-c", WORKER_FLOW_RUN], repo, env)
    try:
        flow.wait_for_line("started")
        helper = psutil.Process(int(flow.output().split("started", 1)[1].split()[0]))
        tree = [*psutil.Process(flow.proc.pid).children(recursive=True), helper]
        assert any("dvc" in " ".join(p.cmdline()) and "repro" in p.cmdline() for p in tree if alive(p))
        assert any("pipeline.services.reaper" in p.cmdline() for p in tree if alive(p)), "dvc has no watcher"
        flow.proc.send_signal(sig)
        assert flow.wait() == -sig
        assert_all_gone(tree, f"the dvc repro of a worker's flow run killed by {signal.Signals(sig).name}")
        assert not broken_state_files(repo) and held_locks(repo) == {}, held_locks(repo)
    finally:
        flow.kill_all()
    params["train"]["steps"] = 1  # a stage that ends: the flow run ends normally, and so does the watcher
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    finished = Stage([sys.executable, "-c", WORKER_FLOW_RUN], repo, env)
    try:
        assert finished.wait() == 0, finished.output()[-3000:]
        assert json.loads((repo / "seen.json").read_text()) == {"epochs": params["sft"]["epochs"]}
        assert not [p for p in psutil.process_iter(["cmdline"]) if "pipeline.services.reaper" in (p.info["cmdline"] or [])
                    and "--while" in p.info["cmdline"] and str(finished.proc.pid) in " ".join(p.info["cmdline"])]
    finally:
        finished.kill_all()


def test_a_lock_table_cut_short_is_left_alone_while_its_dvc_runs_and_set_aside_once_it_ended(repo: Path) -> None:
    driver = experiment(repo, "long")
    try:
        driver.wait_for_line("started")
        table = repo / ".dvc" / "tmp" / "rwlock"
        whole = table.read_bytes()
        assert b'"write"' in whole  # the running stage's locks
        table.write_bytes(whole[: len(whole) // 2])  # as a dvc killed while rewriting it leaves it
        dvc = next(p for p in psutil.Process(driver.proc.pid).children() if "dvc" in " ".join(p.cmdline()))
        with pytest.raises(DvcStillRunning, match=f"{dvc.pid} "):
            set_aside_broken_state(repo)
        assert table.read_bytes() == whole[: len(whole) // 2]  # may be the running dvc's: untouched
        driver.proc.send_signal(signal.SIGTERM)
        assert driver.wait() != 0
    finally:
        driver.kill_all()
    assert broken_state_files(repo)  # dvc could not release its locks through the cut table
    (repo / ".git" / "index.lock").write_bytes(b"")  # and git's index as a dvc killed while committing leaves it
    following = experiment(repo, "short")
    try:
        assert following.wait() == 0, following.output()[-3000:]
    finally:
        following.kill_all()
    for left in ("rwlock", "index.lock"):
        assert f"{left} was left by a dvc killed while writing it" in following.output(), following.output()
    assert not broken_state_files(repo) and (repo / ".git" / "index.lock.stale").exists()
    assert (repo / ".dvc" / "tmp" / "rwlock.cut").read_bytes() == whole[: len(whole) // 2]


STATE = {  # dvc's state files as they are while `dvc exp run` runs a stage (their shapes, from dvc 3)
    "rwlock": {"write": {"/r/out": {"pid": 4242, "cmd": "dvc exp run -n a-s0 -S run.seed=0"}},
               "read": {"/r/params.yaml": [{"pid": 4242, "cmd": "dvc exp run -n a-s0 -S run.seed=0"}]}},
    "exps/rwlock": {"read": {}},
    "exps/run/workspace/workspace.run": {"git_url": "file:///r", "baseline_rev": "f" * 40, "location": "workspace",
                                         "root_dir": "/r", "dvc_dir": ".dvc", "name": "a-s0", "wdir": ".",
                                         "result_hash": None, "result_ref": None, "result_force": False,
                                         "status": 2},
    "exps/run/workspace/workspace.json": {"pid": 4242, "stdin": None, "stdout": None, "stderr": None,
                                          "returncode": None},
}


GIT_LOCKS = ("index.lock", "HEAD.lock", "refs/exps/f0/abf279/a-s0.lock")  # git's, as an unfinished update leaves them


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(STATE) + [f"git:{lock}" for lock in GIT_LOCKS]), st.floats(0, 1, exclude_max=True),
       st.booleans())
def test_any_state_file_a_kill_breaks_is_set_aside_and_nothing_whole_is_touched(name: str, at: float, pad: bool) -> None:
    from dvc.fs import localfs
    from dvc.rwlock import _edit_rwlock

    with tempfile.TemporaryDirectory() as root:
        repo = Path(root)
        tmp, git = repo / ".dvc" / "tmp", repo / ".git"
        for rel, content in STATE.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(json.dumps(content, indent=1 if pad else None))
        (git / "refs" / "exps" / "f0" / "abf279").mkdir(parents=True)
        (git / "refs" / "exps" / "f0" / "abf279" / "a-s0").write_text("f" * 40)  # a ref, not its lock
        assert set(STATE) == {str(p.relative_to(tmp)) for pattern in STATE_PATTERNS for p in tmp.glob(pattern)}
        if name.startswith("git:"):
            broken = git / name.removeprefix("git:")
            broken.write_text("f" * 40)
            assert broken in {p for pattern in GIT_LOCK_PATTERNS for p in git.glob(pattern)}
            left, target = broken.read_bytes(), broken.with_name(broken.name + ".stale")
        else:
            broken = tmp / name
            left, target = broken.read_bytes()[: int(at * broken.stat().st_size)], tmp / f"{name}.cut"
            broken.write_bytes(left)

        assert set_aside_broken_state(repo) == [target]
        assert target.read_bytes() == left and not broken.exists()
        assert all((tmp / rel).read_bytes() == json.dumps(c, indent=1 if pad else None).encode()
                   for rel, c in STATE.items() if tmp / rel != broken)
        assert (git / "refs" / "exps" / "f0" / "abf279" / "a-s0").exists()
        for table in ("", "exps"):  # dvc reads its lock tables again (a missing one is an empty one)
            with _edit_rwlock(str(tmp / table), localfs, False):
                pass
        assert set_aside_broken_state(repo) == []
