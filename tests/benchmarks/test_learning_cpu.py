"""benchmarks.learning_cpu as a driver of the learning-cpu preset: the per-seed figures and the summary read from
eval_compare.json, finding each seed's newest DVC experiment ref; benchmarks.preset_run's workspace files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from benchmarks import learning_cpu
from benchmarks.learning_cpu import experiment_ref, read_compare, seed_figures, seed_line, summary
from benchmarks.preset_run import PRESET, preset_config, preset_run
from pipeline.config import load_config
from pipeline.evaluation.labels import compared_labels
from pipeline.paths import REPO_ROOT

SFT, RL = "SFT (tools)", "SFT + DAPO (tools)"


def compare(sft: float, rl: float, right_tool: float = 0.97, up: int = 7, down: int = 1, p: float = 0.0703125) -> dict:
    """An eval_compare.json as the evaluate stage writes it (pipeline.evaluation.report.comparison)."""
    def model(accuracy: float, tool: float) -> dict:
        return {"model": "m", "mode": "tools", "all": {"accuracy": accuracy, "right_tool": tool, "tool_use": tool,
                                                       "n_problems": 65.0}}
    return {"models": {"base (tools)": model(0.0, 0.0), SFT: model(sft, 0.98), RL: model(rl, right_tool)},
            "order": ["base (tools)", SFT, RL],
            "flips": {"before": SFT, "after": RL, "problems": 65, "to_right": up, "to_wrong": down, "sign_test_p": p}}


def test_the_labels_are_the_presets() -> None:
    cfg = load_config(REPO_ROOT / learning_cpu.PRESET)
    assert compared_labels(cfg.evaluate, cfg.train, cfg.sft, cfg.reward.tepo) == (SFT, RL)


def test_seed_figures_give_the_gain_in_points_the_policys_right_tool_and_the_flips() -> None:
    f = seed_figures(compare(23 / 65, 29 / 65), SFT, RL, None)
    assert (f["sft"], f["sft_dapo"], f["gain_points"]) == (0.3538, 0.4462, 9.23)
    assert (f["right_tool"], f["n_problems"], f["flips_up"], f["flips_down"]) == (0.97, 65, 7, 1)
    assert (f["sign_test_p"], f["wall_s"]) == (0.0703, None)
    assert seed_figures(compare(0.4, 0.3), SFT, RL, 1234.56)["gain_points"] == -10.0
    assert seed_figures(compare(0.4, 0.3), SFT, RL, 1234.56)["wall_s"] == 1234.6


def test_seed_figures_refuse_a_comparison_of_other_models() -> None:
    other = compare(0.3, 0.4)
    del other["models"][SFT]
    with pytest.raises(ValueError, match=r"not 'SFT \(tools\)' -> 'SFT \+ DAPO \(tools\)'"):
        seed_figures(other, SFT, RL, None)
    base_vs_rl = compare(0.3, 0.4)
    base_vs_rl["flips"]["before"] = "base (tools)"
    with pytest.raises(ValueError, match="flips 'base"):
        seed_figures(base_vs_rl, SFT, RL, None)


def test_seed_line_says_when_a_seed_was_not_timed() -> None:
    line = seed_line(2, seed_figures(compare(0.35, 0.45), SFT, RL, None))
    assert line.startswith("seed 2: SFT 35.0 %, SFT + DAPO 45.0 % (+10.0 points on 65), right tool 0.970")
    assert line.endswith("flips 7 up / 1 down (p = 0.0703), not timed here")
    assert seed_line(2, seed_figures(compare(0.35, 0.45), SFT, RL, 3000.0)).endswith(", 50.0 min")


def test_summary_averages_the_seeds_and_judges_each_goal() -> None:
    timed = {0: seed_figures(compare(0.30, 0.42, 0.95), SFT, RL, 3000.0),
             1: seed_figures(compare(0.30, 0.39, 0.90), SFT, RL, 3500.0)}
    s = summary(timed)
    assert (s["mean_gain_points"], s["mean_right_tool"], s["max_wall_s"]) == (10.5, 0.925, 3500.0)
    assert s["goals"] == {"gain_10_points": True, "right_tool_0.9": True, "within_60_min": True}
    assert set(s["seeds"]) == {"0", "1"} and s["seeds"]["1"]["gain_points"] == 9.0
    at_the_goals = summary({0: seed_figures(compare(0.35, 0.45, 0.9), SFT, RL, 3600.0)})
    assert at_the_goals["goals"] == {"gain_10_points": True, "right_tool_0.9": True, "within_60_min": True}
    missed = summary({0: seed_figures(compare(0.30, 0.38, 0.85), SFT, RL, 3700.0)})
    assert missed["goals"] == {"gain_10_points": False, "right_tool_0.9": False, "within_60_min": False}


def test_summary_leaves_the_time_goal_open_unless_the_timed_seeds_decide_it() -> None:
    untimed = seed_figures(compare(0.3, 0.45), SFT, RL, None)
    assert summary({0: untimed})["max_wall_s"] is None
    assert summary({0: untimed})["goals"]["within_60_min"] is None
    assert summary({0: untimed, 1: seed_figures(compare(0.3, 0.45), SFT, RL, 3000.0)})["goals"]["within_60_min"] is None
    too_long = seed_figures(compare(0.3, 0.45), SFT, RL, 4000.0)
    assert summary({0: untimed, 1: too_long})["goals"]["within_60_min"] is False


def git(repo: Path, *args: str, date: str = "2026-12-05T12:00:00") -> str:
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


def experiment(repo: Path, ref: str, content: dict | None, date: str) -> None:
    """A commit holding the preset's params.yaml and metrics/eval_compare.json (or not, with None), under `ref` only,
    as DVC keeps experiments."""
    git(repo, "checkout", "-q", "--orphan", "tmp")
    git(repo, "rm", "-rq", "--cached", "--ignore-unmatch", ".")
    shutil.rmtree(repo / "metrics", ignore_errors=True)
    (repo / "metrics").mkdir()
    (repo / "metrics" / ("eval_compare.json" if content is not None else "eval.json")).write_text(json.dumps(content))
    (repo / "params.yaml").write_text(yaml.safe_dump(load_config(REPO_ROOT / learning_cpu.PRESET).model_dump(mode="json")))
    git(repo, "add", "metrics", "params.yaml")
    git(repo, "commit", "-qm", ref, date=date)
    git(repo, "update-ref", ref, "HEAD")
    git(repo, "checkout", "-q", "--detach")
    git(repo, "branch", "-qD", "tmp")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    experiment(repo, "refs/exps/12/3456/learning-cpu-s0", compare(0.30, 0.35), "2026-12-04T12:00:00")  # first by name
    experiment(repo, "refs/exps/ab/cdef/learning-cpu-s0", compare(0.30, 0.42), "2026-12-05T12:00:00")
    experiment(repo, "refs/exps/ab/cdef/learning-cpu-s01", compare(0.30, 0.50), "2026-12-06T12:00:00")
    experiment(repo, "refs/exps/ab/cdef/learning-cpu-s2", None, "2026-12-06T12:00:00")
    return repo


def test_the_newest_experiment_of_the_seeds_name_is_read(repo: Path) -> None:
    ref = experiment_ref(0, repo)
    assert ref == "refs/exps/ab/cdef/learning-cpu-s0"  # not the older one, nor the newer learning-cpu-s01
    assert read_compare(ref, "metrics/eval_compare.json", repo) == compare(0.30, 0.42)


def test_a_seed_never_run_is_named_with_the_command_that_runs_it(repo: Path) -> None:
    with pytest.raises(LookupError, match=r"no DVC experiment learning-cpu-s1 in .*: run it with `python -m "
                                          r"flows.experiment configs/experiments/learning-cpu.yaml --seeds 1`"):
        experiment_ref(1, repo)
    with pytest.raises(LookupError, match="holds no metrics/eval_compare.json"):
        read_compare(experiment_ref(2, repo), "metrics/eval_compare.json", repo)


def test_collect_prints_a_line_per_seed_and_the_summary_last(repo: Path, capsys: pytest.CaptureFixture) -> None:
    learning_cpu.main(["--seeds", "0", "--collect", "--repo", str(repo)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("seed 0: SFT 30.0 %, SFT + DAPO 42.0 % (+12.0 points") and "not timed here" in lines[0]
    last = json.loads(lines[-1])
    assert (last["mean_gain_points"], last["goals"]["gain_10_points"]) == (12.0, True)
    assert last["goals"]["within_60_min"] is None
    with pytest.raises(SystemExit, match="no DVC experiment learning-cpu-s1"):
        learning_cpu.main(["--seeds", "0", "1", "--collect", "--repo", str(repo)])


def workspace(root: Path) -> Path:
    """A checkout's params.yaml and the preset, none of the preset's outputs."""
    (root / PRESET).parent.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "params.yaml", root / "params.yaml")
    shutil.copy(REPO_ROOT / PRESET, root / PRESET)
    return root


def test_preset_run_refuses_a_workspace_without_the_presets_outputs(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws")
    with pytest.raises(FileNotFoundError, match=r"ws/models/sft/config.json is missing: .* learning-cpu preset ran "
                                                r"\(run it there: python -m flows.experiment .*dvc exp apply"):
        preset_run(root)
    (root / "models" / "sft").mkdir(parents=True)
    (root / "models" / "sft" / "config.json").write_text("{}")
    (root / "data" / "curated").mkdir(parents=True)
    (root / "data" / "curated" / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match=r"ws/data/curated/test.jsonl is missing"):
        preset_run(root)
    with pytest.raises(FileNotFoundError, match=r"configs/experiments/learning-cpu.yaml is missing"):
        preset_run(tmp_path)


def test_preset_config_trains_from_the_workspaces_files_into_the_work_dir(tmp_path: Path) -> None:
    root = workspace(tmp_path / "ws").resolve()
    for name in ("models/sft/config.json", "data/curated/train.jsonl", "data/curated/test.jsonl"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("{}")
    work = (tmp_path / "work").resolve()
    cfg = preset_config(root, work, {"train.update.micro_batch_size": 8, "run.seed": 3})
    assert cfg.train.init_model == str(root / "models/sft")
    assert cfg.train.train_file == str(root / "data/curated/train.jsonl")
    assert cfg.evaluate.split_file == str(root / "data/curated/test.jsonl")
    assert (cfg.train.checkpoints.dir, cfg.train.output_dir) == (str(work / "rl"), str(work / "policy"))
    assert cfg.run.tracking_uri == f"sqlite:///{work / 'mlruns.db'}" and work.is_dir()
    assert (cfg.train.update.micro_batch_size, cfg.run.seed) == (8, 3)
    assert (cfg.train.steps, cfg.rollout.group_size) == (36, 8)  # the preset's, not params.yaml's 16 steps
