"""Nothing outlives its run: a stage killed by any signal leaves no process behind (checked with `ps`),
a stage under a killed `dvc repro` stops writing its outputs, SIGINT / SIGTERM exit 130 / 143, and a
killed stage's MLflow run does not stay RUNNING."""

from __future__ import annotations

import signal
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow import MlflowClient

from flows.tracking import stage_run
from pipeline.config import load_config
from pipeline.paths import REPO_ROOT
from tests.faults.conftest import PYTHON, alive, assert_all_gone, descendants, stage_env, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path("/proc/self").exists(), reason="watches processes through /proc (Linux)")]


def services_params(tmp_path: Path) -> Path:
    """The project's params with a sandbox and a private Redis to start (search itself is 'already running')."""
    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    raw["sandbox"]["workers"] = 1
    raw["search"]["url"] = "http://127.0.0.1:9"  # used as given: not started
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize(("sig", "exit_code"), [(signal.SIGKILL, -9), (signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_killed_stage_leaves_no_process_behind(tmp_path: Path, run_stage, sig: int, exit_code: int) -> None:
    """The services stage starts Prefect's temporary API server, the sandbox (with its workers) and Redis;
    whatever signal ends it, all of them end too."""
    stage = run_stage([PYTHON, "-m", "flows.services", "--params", str(services_params(tmp_path))])
    stage.wait_for_line("services up")
    children = descendants(stage.proc.pid)
    commands = [" ".join(p.cmdline()) for p in children]
    assert any("uvicorn" in c and "prefect" in c for c in commands), commands  # Prefect's temporary server
    assert any("sandbox.code" in c for c in commands) and any("redis-server" in c for c in commands), commands
    stage.proc.send_signal(sig)
    assert stage.wait() == exit_code, stage.output()[-3000:]
    assert_all_gone(children, f"the services stage killed by {signal.Signals(sig).name}")


STAGE = textwrap.dedent("""
    import sys, time, subprocess
    from flows.common import stage_process
    with stage_process():
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        print("started", helper.pid, flush=True)
        with open(sys.argv[1], "a") as out:
            while True:
                out.write("x"); out.flush(); time.sleep(0.02)
""")


def test_a_stage_under_a_killed_dvc_repro_stops_writing_its_outputs(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "stage.py").write_text(STAGE)
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"write": {
        "cmd": f"{PYTHON} stage.py out.txt > stage.log 2>&1", "deps": ["stage.py"], "outs": ["out.txt"]}}}))
    dvc = str(Path(PYTHON).with_name("dvc"))
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=repo, check=True, env=stage_env())
    repro = subprocess.Popen([dvc, "repro"], cwd=repo, env=stage_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        log = repo / "stage.log"
        wait_for(lambda: log.is_file() and "started" in log.read_text() or repro.poll() is not None, "the stage")
        assert "started" in log.read_text(), log.read_text()
        tree = descendants(repro.pid)
        assert any("stage.py" in " ".join(p.cmdline()) for p in tree)
        repro.kill()  # SIGKILL: dvc can do nothing about its stage
        repro.wait()
        assert_all_gone(tree, "the stage of a killed dvc repro")  # the stage, its shell and its helper
        written = (repo / "out.txt").stat().st_size
        assert written > 0
        assert (repo / "out.txt").stat().st_size == written  # nothing writes it any more
    finally:
        if repro.poll() is None:
            repro.kill()


TRACKED = textwrap.dedent("""
    import sys, time
    from flows.common import stage_process
    from flows.tracking import stage_run
    from pipeline.config import load_config
    with stage_process(), stage_run(load_config(sys.argv[1]), "curate") as run_id:
        print("run", run_id, flush=True)
        time.sleep(600)
""")


def _tracked_params(tmp_path: Path) -> Path:
    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    raw["run"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlruns.db'}"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _run_id(stage) -> str:
    stage.wait_for_line("run ")
    return stage.output().split("run ", 1)[1].split()[0]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_a_killed_stage_run_is_not_left_running(tmp_path: Path, run_stage, sig: int, monkeypatch) -> None:
    """SIGINT / SIGTERM: the stage marks its own run KILLED on the way out. SIGKILL: nothing can run in
    the stage, so the next stage that starts marks it KILLED (its process is gone)."""
    monkeypatch.delenv("TAPO_MLFLOW_PARENT_RUN", raising=False)
    monkeypatch.delenv("TAPO_MLFLOW_STAGE_RUN", raising=False)
    params = _tracked_params(tmp_path)
    cfg = load_config(params)
    client = MlflowClient(cfg.run.tracking_uri)
    stage = run_stage([PYTHON, "-c", TRACKED, str(params)])
    run_id = _run_id(stage)
    with stage_run(cfg, "train"):  # another stage starting beside a live one leaves the live one's run alone
        pass
    assert client.get_run(run_id).info.status == "RUNNING"
    stage.proc.send_signal(sig)
    assert stage.wait() == {signal.SIGKILL: -9, signal.SIGINT: 130, signal.SIGTERM: 143}[sig]
    if sig == signal.SIGKILL:
        assert client.get_run(run_id).info.status == "RUNNING"  # as left
        with stage_run(cfg, "curate"):  # the next start of any stage
            pass
    assert client.get_run(run_id).info.status == "KILLED"


RANKS_STAGE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from flows.common import stage_process
    from pipeline.distributed.launch import on_this_machine, run_ranks
    rank = Path(sys.argv[1]) / "rank.py"
    rank.write_text("import time; print('rank up', flush=True); time.sleep(600)")
    with stage_process():
        result = run_ranks([str(rank)], on_this_machine(2), log_dir=Path(sys.argv[1]) / "logs")
        print("launcher exited", result.returncode, flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("killed", ["launcher", "stage"])
def test_ranks_die_with_a_sigkilled_launcher_and_with_a_sigkilled_stage(tmp_path: Path, run_stage,
                                                                         killed: str) -> None:
    """torchrun starts its ranks in sessions of their own and cannot stop them once SIGKILLed: the stage's
    launch call ends them (`run_ranks`); a SIGKILLed stage's watcher ends the launcher and its ranks. The launcher
    is killed as soon as both ranks have printed, which is often before anything could have polled them (the
    rank here does not arm `die_with_launcher`): they are found by the launch's tag."""
    (tmp_path / "stage.py").write_text(RANKS_STAGE)
    stage = run_stage([PYTHON, str(tmp_path / "stage.py"), str(tmp_path)])
    wait_for(lambda: stage.output().count("rank up") == 2 or stage.proc.poll() is not None, "both ranks")
    tree = descendants(stage.proc.pid)
    launcher = [p for p in tree if "torch.distributed.run" in p.cmdline()]
    ranks = [p for p in tree if p.cmdline()[-1:] == [str(tmp_path / "rank.py")] and p not in launcher]
    assert len(launcher) == 1 and len(ranks) == 2, stage.output()
    (launcher[0] if killed == "launcher" else psutil.Process(stage.proc.pid)).kill()
    if killed == "launcher":
        stage.wait_for_line("launcher exited -9")
    assert_all_gone(ranks + launcher, f"the ranks of a SIGKILLed {killed}")


def test_a_stage_started_by_hand_outlives_its_shell_and_its_helpers_die_with_it(tmp_path: Path) -> None:
    """Not under dvc, the stage's parent is no anchor (`nohup python -m flows.train &` must survive the
    shell); SIGKILL of the stage still ends what it started."""
    (tmp_path / "stage.py").write_text(STAGE)
    shell = subprocess.run(["sh", "-c", f"{PYTHON} stage.py out.txt > stage.log 2>&1 & echo $!"], cwd=tmp_path,
                           env=stage_env(), capture_output=True, text=True, check=True)
    stage = psutil.Process(int(shell.stdout.strip()))  # its shell has exited
    try:
        log = tmp_path / "stage.log"
        wait_for(lambda: log.is_file() and "started" in log.read_text() or not alive(stage), "the stage")
        assert alive(stage), log.read_text()
        helper = psutil.Process(int(log.read_text().split("started", 1)[1].split()[0]))
        size = (tmp_path / "out.txt").stat().st_size
        wait_for(lambda: (tmp_path / "out.txt").stat().st_size > size, "the orphaned stage to go on working")
        tree = [stage, *descendants(stage.pid)]
        assert helper in tree
        stage.kill()
        assert_all_gone(tree, "a stage killed by SIGKILL")
    finally:
        if alive(stage):
            stage.kill()


# A wrapper such as dvc: it waits for the process it started and, once that ends, cleans up (rewrites a file,
# 0.3 s from first byte to last), then exits; SIGTERM kills it at once, whatever it was doing. `hangs`: it never
# ends on its own.
WRAPPER = textwrap.dedent("""
    import subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("child", child.pid, flush=True)
    child.wait()
    with open(sys.argv[1], "w") as table:
        table.write("{"); table.flush(); time.sleep(0.3); table.write("}")
    while sys.argv[2] == "hangs":
        time.sleep(1)
""")
DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    from flows.common import ends_on_its_own, stage_process
    with stage_process():
        wrapper = subprocess.Popen([sys.executable, "wrapper.py", "table.json", sys.argv[1]])
        ends_on_its_own(wrapper.pid)
        print("started", wrapper.pid, flush=True)
        time.sleep(600)
""")


@pytest.mark.parametrize("wrapper", ["ends", "hangs"])
def test_a_spared_process_sees_what_it_started_end_and_cleans_up_before_it_is_ended(tmp_path: Path, run_stage,
                                                                                   wrapper: str) -> None:
    """The driver of `dvc exp run` is SIGKILLed: its watcher ends dvc's stage first and lets dvc end on its own
    (it rewrites its lock table then: signalled in the middle, it would leave the table cut); a spared process
    that does not end on its own is ended after 2 * GRACE_S all the same."""
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    (tmp_path / "driver.py").write_text(DRIVER)
    stage = run_stage([PYTHON, str(tmp_path / "driver.py"), wrapper])
    stage.wait_for_line("started")
    spared = psutil.Process(int(stage.output().split("started", 1)[1].split()[0]))
    wait_for(lambda: len(descendants(spared.pid)) == 1, "the wrapper's child")
    tree = [spared, *descendants(spared.pid)]
    stage.proc.kill()
    assert stage.wait() == -9
    assert_all_gone(tree, "the tree of a SIGKILLed driver")
    assert (tmp_path / "table.json").read_text() == "{}"  # its clean-up ran whole: it was not signalled before


def test_sparing_through_a_watcher_that_is_gone_says_so_and_does_not_fail_the_stage(capsys) -> None:
    """The watcher died first (an OOM kill takes the biggest, not the oldest): naming a process to it must not raise
    in the stage (a BrokenPipeError there would fail a healthy experiment), and the stage's log says what is lost."""
    from pipeline.services.reaper import spare

    gone = subprocess.Popen([PYTHON, "-c", "pass"], stdin=subprocess.PIPE)
    gone.wait()
    spare(gone, gone.pid)
    assert "the stage's watcher is gone" in capsys.readouterr().err
    gone.stdin.close()  # nothing the dead watcher could not take is left to fail the close (or the stage's exit)
