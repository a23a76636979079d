"""The train stage's launcher (`pipeline.distributed.launch`): placement from params, the launcher commands, and
real torchrun runs of small rank programs (no DeepSpeed): the ranks' environment and prefixed output, a failing
rank stopping the others, a time limit, and no process left afterwards."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipeline.config import ConfigError, config_from_dict
from pipeline.config.distributed import DistributedConfig
from pipeline.distributed import launch
from pipeline.distributed.launch import (RankLayout, launcher_command, on_this_machine, rank_layout, rank_log_tail,
                                         root_cause, run_ranks)

RANK = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    out, mode = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))
    print(f"hello from {rank} of {os.environ['WORLD_SIZE']} at {os.environ['MASTER_ADDR']}", flush=True)
    if mode == "fail" and rank == 1:
        time.sleep(0.5)
        print("rank 1 gives up", file=sys.stderr, flush=True)
        sys.exit(3)
    if mode in ("fail", "hang"):
        time.sleep(600)
""")


@pytest.fixture
def rank_script(tmp_path: Path) -> Path:
    path = tmp_path / "rank.py"
    path.write_text(RANK)
    return path


def rank_pids(out: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(out.glob("rank*.pid"))]


def gone(pids: list[int]) -> bool:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    return not any(alive(pid) for pid in pids)


def test_auto_is_the_visible_gpus_and_one_rank_without_any(monkeypatch) -> None:
    monkeypatch.setattr(launch, "visible_gpus", lambda: 0)
    assert rank_layout(DistributedConfig(enabled=True)).nproc_per_node == 1
    monkeypatch.setattr(launch, "visible_gpus", lambda: 8)
    assert rank_layout(DistributedConfig(enabled=True)) == RankLayout(8, 1, "torchrun", None, "")
    assert rank_layout(DistributedConfig(enabled=True, nproc_per_node=2)).nproc_per_node == 2  # set: as set


def test_a_hostfile_leaves_the_rank_count_to_its_slots(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node-1 slots=8\nnode-2 slots=8\n")
    cfg = DistributedConfig(enabled=True, nnodes=2, hostfile=str(hostfile), launcher="deepspeed")
    assert rank_layout(cfg) == RankLayout(None, 2, "deepspeed", hostfile, "")
    with pytest.raises(FileNotFoundError, match="distributed.hostfile"):
        rank_layout(cfg.model_copy(update={"hostfile": str(tmp_path / "missing")}))


@pytest.mark.parametrize(("section", "keys"), [
    ({"nnodes": 2}, "distributed.nnodes.*distributed.hostfile"),
    ({"hostfile": "hosts", "launcher": "torchrun"}, "distributed.hostfile.*distributed.launcher"),
    ({"nproc_per_node": "2"}, "nproc_per_node"),
    ({"nproc_per_node": 0}, "nproc_per_node"),
    ({"launcher": "mpirun"}, "launcher"),
])
def test_placements_that_cannot_run_are_refused_by_name(section: dict, keys: str) -> None:
    with pytest.raises(ConfigError, match=keys):
        config_from_dict({"distributed": section})


@pytest.mark.parametrize("module", [True, False])
@pytest.mark.parametrize(("where", "expected"), [
    (RankLayout(2, 1, "torchrun", None, ""),
     ["torch.distributed.run", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
      "--master-port", "2950", "--max-restarts", "0"]),
    (RankLayout(None, 2, "deepspeed", Path("/h"), ""),
     ["deepspeed.launcher.runner", "--master_port", "2950", "--no_local_rank", "--hostfile", "/h", "--num_nodes", "2"]),
    (RankLayout(8, 2, "deepspeed", Path("/h"), "node-1"),
     ["--hostfile", "/h", "--num_nodes", "2", "--num_gpus", "8", "--master_addr", "node-1"]),
])
def test_launcher_commands(where: RankLayout, expected: list[str], module: bool, tmp_path: Path) -> None:
    program = ["-m", "pipeline.train", "--params", "p.yaml"] if module else ["run.py", "--x"]
    command = launcher_command(dataclasses.replace(where, python="py"), program, port=2950, log_dir=tmp_path)
    assert command[0] == "py" and " ".join(expected) in " ".join(command)
    flag = {"torchrun": "-m", "deepspeed": "--module"}[where.launcher]
    tail = [flag, "pipeline.train", "--params", "p.yaml"] if module else ["run.py", "--x"]
    assert command[-len(tail):] == tail  # the program last, as it was given


def test_ranks_get_their_environment_and_their_lines_are_prefixed(tmp_path: Path, rank_script: Path) -> None:
    lines: list[str] = []
    result = run_ranks([str(rank_script), str(tmp_path), "ok"], on_this_machine(2), log_dir=tmp_path / "logs",
                       on_line=lines.append, timeout_s=300)
    assert result.returncode == 0, result.tail
    for rank in (0, 1):
        assert f"[rank{rank}]:hello from {rank} of 2 at 127.0.0.1" in lines
    logs = sorted(p.read_text() for p in (tmp_path / "logs").rglob("stdout.log"))
    assert logs == ["hello from 0 of 2 at 127.0.0.1\n", "hello from 1 of 2 at 127.0.0.1\n"]  # each rank's own file


def test_a_failing_rank_stops_the_others_and_is_named(tmp_path: Path, rank_script: Path) -> None:
    started = time.monotonic()
    result = run_ranks([str(rank_script), str(tmp_path), "fail"], on_this_machine(2), log_dir=tmp_path / "logs",
                       on_line=lambda _: None, timeout_s=300)
    assert result.returncode != 0
    failure = root_cause(result.tail)  # rank 0 was stopped for it
    assert failure is not None and (failure.rank, failure.exit_code) == (1, 3), result.tail
    assert rank_log_tail(tmp_path / "logs", failure.local_rank).endswith("rank 1 gives up")  # its own last words
    assert time.monotonic() - started < 240  # rank 0 (sleeping 600 s) was stopped, not waited for
    assert len(rank_pids(tmp_path)) == 2 and gone(rank_pids(tmp_path))


def test_a_time_limit_stops_every_rank(tmp_path: Path, rank_script: Path) -> None:
    result = run_ranks([str(rank_script), str(tmp_path), "hang"], on_this_machine(2), log_dir=tmp_path / "logs",
                       on_line=lambda _: None, timeout_s=20)
    assert result.returncode != 0
    assert len(rank_pids(tmp_path)) == 2 and gone(rank_pids(tmp_path))


def test_the_python_that_launches_is_the_ranks_python(tmp_path: Path) -> None:
    command = launcher_command(on_this_machine(1), ["x.py"], port=1, log_dir=tmp_path)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]  # ranks run in the launcher's environment
