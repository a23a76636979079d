"""Seeds as one command: the statistics of `pipeline.evaluation.seeds` against hand-computed values, and
`flows.experiment --seeds` run for real in a tiny DVC repository (the project's params.yaml, one stage that writes
the two headline files from run.seed): it ends with the summary, `--summarise` prints it again, and the numbers read
are those `dvc exp show --json` reports."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.experiment import HEADLINE_FILES, experiment_headline, main, seed_headlines
from pipeline.evaluation.seeds import Interval, pooled_flips, render_summary, summarise_seeds, t_interval

# Student's t quantiles t(0.975, df), from the printed tables.
T_975 = {1: 12.7062, 2: 4.3027}
STAGE = """\
stages:
  score:
    cmd: python write_headline.py
    deps: [write_headline.py]
    params: [run.seed]
    metrics:
      - metrics/headline/train.json: {cache: false}
      - metrics/headline/eval.json: {cache: false}
"""
# Seed s: reward 0.4 + 0.1 s, accuracy 0.5 + 0.02 s, SFT 0.5, flips (3 + s) / 1.
WRITER = """\
import json, os, yaml
seed = yaml.safe_load(open("params.yaml"))["run"]["seed"]
os.makedirs("metrics/headline", exist_ok=True)
json.dump({"reward": 0.4 + 0.1 * seed}, open("metrics/headline/train.json", "w"))
json.dump({"accuracy": 0.5 + 0.02 * seed, "right_tool": 0.9, "acc_sft": 0.5, "to_right": 3 + seed, "to_wrong": 1,
           "p_value": 0.625}, open("metrics/headline/eval.json", "w"))
"""


def test_the_interval_is_student_t_over_the_seeds() -> None:
    got = t_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, half width t(0.975, 2) / sqrt(3)
    half = T_975[2] / math.sqrt(3)
    assert got.n == 3 and got.mean == 2.0
    assert got.low == pytest.approx(2 - half, abs=1e-4) and got.high == pytest.approx(2 + half, abs=1e-4)
    two = t_interval([0.0, 2.0])  # mean 1, s = sqrt(2), se = 1
    assert (two.low, two.high) == (pytest.approx(1 - T_975[1], abs=1e-4), pytest.approx(1 + T_975[1], abs=1e-4))
    assert t_interval([0.5]) == Interval(1, 0.5, None, None)  # one seed: no interval
    same = t_interval([0.3, 0.3, 0.3])
    assert (same.n, same.low, same.high) == (3, pytest.approx(0.3), pytest.approx(0.3))  # no spread, no width
    with pytest.raises(ValueError):
        t_interval([])


def test_the_flips_of_all_seeds_are_pooled_into_one_sign_test() -> None:
    seeds = {"a-s0": {"to_right": 5.0, "to_wrong": 1.0}, "a-s1": {"to_right": 3.0, "to_wrong": 1.0},
             "a-s2": {"to_right": 11.0, "to_wrong": 1.0}, "a-s3": {"accuracy": 0.5}}  # s3 evaluated no baseline
    pooled = pooled_flips(seeds)
    assert pooled is not None and (pooled.seeds, pooled.to_right, pooled.to_wrong) == (3, 19, 3)
    # 19 / 3 of 22 flips: p = 2 * (C(22,0) + C(22,1) + C(22,2) + C(22,3)) / 2^22 = 2 * 1794 / 4194304
    assert pooled.sign_test_p == pytest.approx(2 * 1794 / 2 ** 22, rel=1e-12)
    assert pooled_flips({"a-s0": {"accuracy": 0.5}}) is None


def test_each_headline_is_summarised_with_the_gain_over_sft_and_the_p_values_are_not_averaged() -> None:
    seeds = {"m-s0": {"reward": 0.4, "accuracy": 0.52, "acc_sft": 0.50, "to_right": 4.0, "to_wrong": 2.0,
                      "p_value": 0.69},
             "m-s1": {"reward": 0.6, "accuracy": 0.50, "acc_sft": 0.45, "to_right": 6.0, "to_wrong": 0.0,
                      "p_value": 0.031}}
    summary = summarise_seeds(seeds)
    assert list(summary) == ["reward", "accuracy", "acc_sft", "to_right", "to_wrong", "gain"]
    assert summary["gain"].mean == pytest.approx(0.035)  # (0.02 + 0.05) / 2
    assert summary["gain"].high == pytest.approx(0.035 + T_975[1] * 0.015, abs=1e-5)  # s = 0.0212, se = 0.015
    lines = render_summary(seeds).splitlines()
    assert lines[0].split() == ["headline", "n", "mean", "95", "%", "CI", "(t)", "m-s0", "m-s1"]
    assert lines[1].split()[:3] == ["reward", "2", "0.5"]
    assert lines[-2].split() == ["p_value", "0.69", "0.031"]
    assert lines[-1] == ("Pooled flips over 2 seeds: 10 wrong -> right, 2 right -> wrong (two-sided sign test "
                         "p = 0.0386).")


def sh(repo: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "DVC_NO_ANALYTICS": "1"}
    done = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def experiments(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A DVC repository (the project's params.yaml, one stage writing the two headline files from run.seed) in
    which `python -m flows.experiment configs/experiments/toy.yaml --seeds 0 1 2` ran: the repository and what the
    command printed."""
    repo = tmp_path_factory.mktemp("seeds-repo")
    shutil.copy(repo_root / "params.yaml", repo / "params.yaml")
    (repo / "dvc.yaml").write_text(STAGE)
    (repo / "write_headline.py").write_text(WRITER)
    (repo / "configs" / "experiments").mkdir(parents=True)
    (repo / "configs" / "experiments" / "toy.yaml").write_text("extends: ../../params.yaml\ntrain: {steps: 3}\n")
    git = ("git", "-c", "user.name=t", "-c", "user.email=t@example.com")
    sh(repo, *git, "init", "-q")
    sh(repo, "dvc", "init", "-q")
    sh(repo, *git, "add", "-A")
    sh(repo, *git, "commit", "-q", "-m", "toy")
    out = sh(repo, sys.executable, "-m", "flows.experiment", "configs/experiments/toy.yaml", "--seeds", "0", "1", "2")
    return repo, out


def exp_show_metrics(repo: Path) -> dict[str, dict[str, float]]:
    """Experiment name -> its metrics (both files merged), as `dvc exp show --json` reports them."""
    out: dict[str, dict[str, float]] = {}
    for baseline in json.loads(sh(repo, "dvc", "exp", "show", "--json")):
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                files = rev["data"]["metrics"]
                out[rev["name"]] = {k: float(v) for f in HEADLINE_FILES for k, v in files[f]["data"].items()}
    return out


def test_the_seeds_headlines_are_what_dvc_exp_show_reports(experiments: tuple[Path, str]) -> None:
    repo, _ = experiments
    got = seed_headlines("toy", [0, 1, 2], repo)
    assert got == exp_show_metrics(repo)
    assert list(got) == ["toy-s0", "toy-s1", "toy-s2"]
    assert got["toy-s2"]["reward"] == pytest.approx(0.6) and got["toy-s2"]["to_right"] == 5.0
    with pytest.raises(LookupError, match="no DVC experiment toy-s7"):
        seed_headlines("toy", [0, 7], repo)
    with pytest.raises(LookupError, match="HEAD holds none of metrics/headline/train.json, metrics/headline/eval.json"):
        experiment_headline("HEAD", repo)  # the commit the experiments ran on: no stage ran there


def summary_rows(lines: list[str]) -> dict[str, list[str]]:
    """The seeds' table below its title line: headline -> its cells."""
    start = next(i for i, line in enumerate(lines) if line.startswith("toy: 3 seeds")) + 2
    return {line.split()[0]: line.split() for line in lines[start:] if not line.startswith("Pooled")}


def check_summary(lines: list[str]) -> None:
    assert "toy: 3 seeds (toy-s0, toy-s1, toy-s2)" in lines
    rows = summary_rows(lines)
    # accuracy 0.50 / 0.52 / 0.54: mean 0.52, s = 0.02, half width t(0.975, 2) * 0.02 / sqrt(3) = 0.0497
    assert rows["accuracy"][:5] == ["accuracy", "3", "0.52", "[0.4703,", "0.5697]"]
    assert rows["gain"][:3] == ["gain", "3", "0.02"] and rows["p_value"][1:] == ["0.625"] * 3
    # flips 3/1, 4/1, 5/1 pooled: 12 / 3 of 15, p = 2 * (1 + 15 + 105 + 455) / 2^15 = 0.0352
    assert lines[-1] == "Pooled flips over 3 seeds: 12 wrong -> right, 3 right -> wrong (two-sided sign test p = 0.0352)."


def test_the_seeds_command_ends_with_the_summary(experiments: tuple[Path, str]) -> None:
    _, out = experiments
    check_summary(out.rstrip().splitlines())


def test_summarise_prints_the_table_of_experiments_already_run(experiments: tuple[Path, str],
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo, _ = experiments
    monkeypatch.chdir(repo)
    assert main(["configs/experiments/toy.yaml", "--seeds", "0", "1", "2", "--summarise"]) == 0
    check_summary(capsys.readouterr().out.rstrip().splitlines())
    assert main(["configs/experiments/toy.yaml", "--seeds", "3", "--summarise"]) == 1
    assert capsys.readouterr().err.startswith("summary: no DVC experiment toy-s3 in ")
