"""The train flow's side of data parallelism (`flows.ranks`): what it refuses before launching, what every rank is
given, and a failing rank failing the stage with its name and exit code."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

from pipeline import train as train_module
from flows.ranks import RanksFailed, rank_program, stage_layout, train_on_ranks
from pipeline.config import config_from_dict, load_config
from pipeline.distributed.launch import launcher_command, on_this_machine, rank_layout
from pipeline.tracking.runs import STAGE_RUN_ENV
from pipeline.training_run.plan import RunPlan

# A resumed run's plan, with what a shell or a launcher would mangle: spaces, quotes, a newline, non-ASCII.
PLAN = RunPlan(Path("runs/train/exp 'one'"), {"train.optimizer.lr": 1e-6, "rollout.stop": ["</answer>\n", "$HOME"]},
               {"code": "c0ffee"}, "insisted", True, "--resume: continuing the run in runs/train/exp 'one' (é)",
               Path("runs/train/exp 'one'/checkpoints/step-000004"))


def test_one_process_launches_nothing() -> None:
    assert stage_layout(config_from_dict({}), ("code",)) is None


def test_a_stage_started_as_a_rank_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit, match="launches its ranks itself"):
        stage_layout(config_from_dict({"distributed": {"enabled": True}}), ())


@pytest.mark.parametrize(("tools", "named"), [(("code",), "sandbox.url"), (("code", "search"), "sandbox.url, search.url"),
                                             (("search",), "search.url")])
def test_several_nodes_need_services_every_node_reaches(tmp_path: Path, tools: tuple, named: str) -> None:
    (tmp_path / "hosts").write_text("a slots=1\nb slots=1\n")
    cfg = config_from_dict({"distributed": {"enabled": True, "nnodes": 2, "hostfile": str(tmp_path / "hosts"),
                                            "launcher": "deepspeed"}})
    with pytest.raises(SystemExit, match=f"set {named} to a shared deployment"):
        stage_layout(cfg, tools)
    shared = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"url": "http://tools:1"}),
                                    "search": cfg.search.model_copy(update={"url": "http://tools:2"})})
    assert stage_layout(shared, tools).nnodes == 2


@pytest.mark.skipif(find_spec("vllm") is not None, reason="this environment has vLLM")
def test_ranks_whose_environment_lacks_the_backend_are_refused_by_name() -> None:
    cfg = config_from_dict({"distributed": {"enabled": True}, "rollout": {"backend": "vllm"}})
    with pytest.raises(SystemExit, match=r"rollout.backend vllm: the ranks run with the stage's own Python "
                                         r"\(.*\), which lacks vllm; set distributed.python"):
        stage_layout(cfg, ())


def test_an_interpreter_without_the_training_side_is_refused_naming_what_it_lacks(tmp_path: Path) -> None:
    bare = tmp_path / "bare"  # a fresh environment: neither DeepSpeed nor MLflow
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    cfg = config_from_dict({"distributed": {"enabled": True, "python": str(bare / "bin/python")}})
    with pytest.raises(SystemExit, match=rf"the ranks run with distributed.python \({re.escape(str(bare))}/bin/python\), "
                                         r"which lacks deepspeed, mlflow;"):
        stage_layout(cfg, ())


@pytest.mark.parametrize("where", ["nowhere/bin/python", "a-folder"])
def test_a_missing_interpreter_is_refused_naming_the_key(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-folder").mkdir()  # searchable, so "executable" to os.access, yet nothing to run
    cfg = config_from_dict({"distributed": {"enabled": True, "python": str(tmp_path / where)}})
    with pytest.raises(FileNotFoundError, match=f"distributed.python: .*{where} is no executable"):
        stage_layout(cfg, ())


@pytest.mark.parametrize("program", ["true", "echo"])
def test_an_executable_that_is_no_python_is_refused(program: str) -> None:
    """`true` answers nothing and succeeds, `echo` answers something else: neither may pass for an environment
    that lacks nothing."""
    cfg = config_from_dict({"distributed": {"enabled": True, "python": shutil.which(program)}})
    with pytest.raises(RuntimeError, match="could not be asked for its modules"):
        stage_layout(cfg, ())


def test_the_ranks_run_with_the_interpreter_named_as_written(tmp_path: Path, monkeypatch) -> None:
    """A relative path is the stage's working directory's, and a link is kept as a link (a venv's python is one:
    resolved, it would be the base interpreter without the venv's packages)."""
    (tmp_path / "env/bin").mkdir(parents=True)
    (tmp_path / "env/bin/python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    where = rank_layout(config_from_dict({"distributed": {"enabled": True, "python": "env/bin/python"}}).distributed)
    assert where.python == str(tmp_path / "env/bin/python")
    assert launcher_command(where, ["-m", "x"], port=1, log_dir=tmp_path)[0] == where.python
    assert rank_layout(config_from_dict({"distributed": {"enabled": True}}).distributed).python == sys.executable


def test_every_rank_is_given_the_params_the_services_and_the_stage_run(monkeypatch) -> None:
    monkeypatch.setenv(STAGE_RUN_ENV, "run123")
    program = rank_program("p.yaml", {"search": "http://s", "code": "http://c"}, PLAN)
    assert program == ["-m", "pipeline.train", "--params", "p.yaml", "--metrics-dir", "metrics",
                       "--tool-url=code=http://c", "--tool-url=search=http://s", "--stage-run", "run123",
                       "--plan", PLAN.encoded()]
    assert re.fullmatch(r"[A-Za-z0-9_=-]+", program[-1])  # one word to any shell a launcher hands it to


def test_a_failing_rank_fails_the_stage_naming_it(tmp_path: Path, repo_root: Path) -> None:
    params = yaml.safe_load((repo_root / "params.yaml").read_text())
    params["train"]["train_file"] = str(tmp_path / "missing.jsonl")  # every rank fails reading it
    params["distributed"] |= {"enabled": True, "nproc_per_node": 2, "collectives": "gloo"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    lines: list[str] = []
    with pytest.raises(RanksFailed, match=r"rank \d \(exit code 1\) failed first") as failed:
        train_on_ranks(on_this_machine(2), tmp_path / "params.yaml", {}, PLAN, lines.append,
                       metrics_dir=tmp_path / "metrics", log_dir=tmp_path / "logs")
    assert "missing.jsonl" in str(failed.value)  # the failing rank's own error, in the stage's failure
    assert any(line.startswith("[rank1]:") for line in lines) and any(line.startswith("[rank0]:") for line in lines)


@pytest.mark.parametrize("ad_hoc", [False, True])
def test_every_rank_trains_the_flows_run_where_the_flow_placed_it(monkeypatch, tmp_path: Path, repo_root: Path,
                                                                   ad_hoc: bool) -> None:
    """The rank's command line, as `python -m pipeline.train` parses it: the stage's plan (the run's folder, the
    checkpoint every rank starts from) and an ad-hoc run's model and metrics places reach `run`; without the
    places, the params' own."""
    monkeypatch.setenv(STAGE_RUN_ENV, "run123")  # restored afterwards (the rank entry sets it from --stage-run)
    model = tmp_path / "runs/train/exp/models/policy" if ad_hoc else None
    plan = PLAN if ad_hoc else RunPlan(Path("runs/train/cfg-0123456789"), {}, {}, "auto", False, "fresh", None)
    program = rank_program(repo_root / "params.yaml", {"code": "http://c"}, plan,
                           metrics_dir=tmp_path / "metrics", output_dir=model)
    called: dict = {}
    monkeypatch.setattr(train_module, "run",
                        lambda cfg, urls, plan, **kw: called.update(cfg=cfg, urls=urls, plan=plan, **kw))
    monkeypatch.setattr(train_module, "die_with_launcher", lambda: None)
    monkeypatch.setattr(train_module, "leave_process_group", lambda: None)
    assert program[:2] == ["-m", "pipeline.train"]
    train_module.main(program[2:])
    params = load_config(repo_root / "params.yaml")
    assert called["plan"] == plan and called["urls"] == {"code": "http://c"}
    assert called["metrics_dir"] == tmp_path / "metrics"
    assert called["cfg"].train.output_dir == (str(model) if ad_hoc else params.train.output_dir)
    placed_train = called["cfg"].train.model_copy(update={"output_dir": params.train.output_dir})
    assert called["cfg"].model_copy(update={"train": placed_train}) == params  # nothing else changed
