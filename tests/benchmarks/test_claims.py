"""benchmarks.claims reads each arm's experiments from their git refs and puts them side by side.

The refs are made with plain git, as DVC keeps experiments (a commit under refs/exps/<..>/<baseline>/<name>)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from benchmarks import claims
from pipeline.config import load_config
from pipeline.paths import REPO_ROOT

SFT, RL = "SFT (tools)", "SFT + DAPO (tools)"
ARM_RL = {"dapo": RL, "tepo-sparse": "SFT + DAPO + TEPO sparse (tools)"}  # the policy's row, from each arm's params


def params(arm: str) -> str:
    """The params.yaml an experiment of `arm` commits: the main job's, with the arm's preset applied."""
    preset = REPO_ROOT / "params.yaml" if arm == "dapo" else REPO_ROOT / "configs" / "experiments" / f"{arm}.yaml"
    return yaml.safe_dump(load_config(preset).model_dump(mode="json"))


def compare(sft: float, rl: float, calls: float = 1.0, rl_label: str = RL) -> dict:
    def model(accuracy: float) -> dict:
        per = {"accuracy": accuracy, "right_tool": 0.9, "n_problems": 10.0, "calls_per_rollout/code": calls / 2,
               "calls_per_rollout/search": calls / 2}
        return {"all": per, "calculator": per | {"accuracy": accuracy - 0.1}, "wiki_facts": per, "mode": "tools"}
    return {"models": {SFT: model(sft), rl_label: model(rl)}, "flips": {}}


def history(steps: int, share: bool) -> list[dict]:
    return [{"step": s, "reward/mean": s / 10, "rollout/calls_per_traj/code": 0.5, "rollout/calls_per_traj/search":
             0.25, "train/entropy": 1.0, "train/ref_kl": 0.01 * s}
            | ({"rollout/entropy_reducing_call_share": 0.5 + s / 100} if share else {}) for s in range(steps)]


def git(repo: Path, *args: str, date: str = "2026-12-05T12:00:00") -> str:
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def experiment(repo: Path, ref: str, files: dict[str, str], date: str) -> None:
    """A commit holding `files` (path -> text), under `ref` only, made without a work tree."""
    index = repo / ".git" / "tmp-index"
    env_index = {"GIT_INDEX_FILE": str(index)}
    for path, text in files.items():
        blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, input=text, text=True,
                              capture_output=True, check=True).stdout.strip()
        subprocess.run(["git", "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"], cwd=repo,
                       env=os.environ | env_index, check=True)
    tree = subprocess.run(["git", "write-tree"], cwd=repo, env=os.environ | env_index, capture_output=True,
                          text=True, check=True).stdout.strip()
    index.unlink()
    commit = git(repo, "commit-tree", tree, "-m", ref, date=date).strip()
    git(repo, "update-ref", ref, commit)


def files(sft: float, rl: float, steps: int = 8, share: bool = True, arm: str = "dapo") -> dict[str, str]:
    return {"params.yaml": params(arm), "metrics/eval_compare.json": json.dumps(compare(sft, rl, rl_label=ARM_RL[arm])),
            "metrics/train_history.jsonl": "\n".join(json.dumps(r) for r in history(steps, share)) + "\n"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    experiment(repo, "refs/exps/aa/1111/dapo-s0", files(0.4, 0.3), "2026-12-04T12:00:00")  # older: replaced
    experiment(repo, "refs/exps/bb/2222/dapo-s0", files(0.4, 0.45, share=False), "2026-12-05T12:00:00")
    experiment(repo, "refs/exps/bb/2222/tepo-sparse-s1", files(0.4, 0.5, arm="tepo-sparse"), "2026-12-05T13:00:00")
    experiment(repo, "refs/exps/bb/2222/tepo-sparse-s0", files(0.4, 0.35, arm="tepo-sparse"), "2026-12-05T14:00:00")
    experiment(repo, "refs/exps/bb/2222/main-s2", files(0.1, 0.9), "2026-12-05T15:00:00")  # no arm's name
    experiment(repo, "refs/exps/bb/2222/no-code-s0x", files(0.1, 0.9), "2026-12-05T15:00:00")
    return repo


def test_the_newest_experiment_of_each_arm_and_seed_in_arm_order(repo: Path) -> None:
    found = claims.experiments(repo, claims.ARMS)
    assert list(found) == ["dapo-s0", "tepo-sparse-s0", "tepo-sparse-s1"]
    assert found["dapo-s0"] == "refs/exps/bb/2222/dapo-s0"
    assert list(claims.experiments(repo, ("tepo-sparse",))) == ["tepo-sparse-s0", "tepo-sparse-s1"]


def test_figures_are_the_policys_held_out_numbers_and_the_last_quarter_of_training() -> None:
    f = claims.figures(compare(0.40, 0.46), history(8, share=True), SFT, RL)
    assert f["accuracy"] == 0.46 and f["gain_points"] == pytest.approx(6.0)
    assert f["accuracy/calculator"] == pytest.approx(0.36) and f["calls_per_problem"] == 1.0
    assert f["train/reward"] == pytest.approx((0.6 + 0.7) / 2)  # steps 6 and 7: the last quarter of 8
    assert f["train/calls/traj"] == 0.75 and f["train/H-reducing"] == pytest.approx(0.565)
    assert claims.figures(compare(0.4, 0.4), history(8, share=False), SFT, RL)["train/H-reducing"] is None


def test_main_prints_the_table_and_the_json_last_and_draws_the_plot(repo: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    png = tmp_path / "claims.png"
    claims.main(["--repo", str(repo), "--png", str(png)])
    out = capsys.readouterr().out.strip().splitlines()
    rows = [line for line in out if line.startswith("| dapo") or line.startswith("| tepo")]
    assert [r.split(" | ")[0] for r in rows] == ["| dapo-s0", "| tepo-sparse-s0", "| tepo-sparse-s1"]
    assert "| 45.0 | +5.0 |" in rows[0] and rows[0].rstrip(" |").split(" | ")[-3] == "n/a"
    last = json.loads(out[-1])
    assert last["tepo-sparse-s1"]["gain_points"] == 10.0
    assert png.stat().st_size > 10_000


def test_a_repo_without_any_arm_is_refused(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    with pytest.raises(SystemExit, match="no experiment named"):
        claims.main(["--repo", str(tmp_path)])


def test_each_experiment_is_read_with_the_rows_its_own_params_name(tmp_path: Path) -> None:
    """An experiment whose params name the policy otherwise (an older one, labelled by hand) is read by its own
    names; one whose comparison has no row by those names, or that holds no params, is refused naming it."""
    git(tmp_path, "init", "-q")
    older = yaml.safe_load(params("tepo-sparse"))
    older["evaluate"]["label"] = "SFT + DAPO (tools)"
    experiment(tmp_path, "refs/exps/aa/1111/tepo-sparse-s0", files(0.4, 0.5) | {"params.yaml": yaml.safe_dump(older)},
               "2026-12-05T12:00:00")
    claims.main(["--repo", str(tmp_path), "--arms", "tepo-sparse"])
    experiment(tmp_path, "refs/exps/aa/1111/tepo-sparse-s1", files(0.4, 0.5) | {"params.yaml": params("tepo-sparse")},
               "2026-12-05T13:00:00")
    with pytest.raises(SystemExit, match=r"tepo-sparse-s1: .*no row 'SFT \+ DAPO \+ TEPO sparse \(tools\)'"):
        claims.main(["--repo", str(tmp_path), "--arms", "tepo-sparse"])
    experiment(tmp_path, "refs/exps/aa/1111/tepo-sparse-s1", {"metrics/eval_compare.json": "{}"}, "2026-12-05T14:00:00")
    with pytest.raises(SystemExit, match="tepo-sparse-s1: .*holds no params.yaml"):
        claims.main(["--repo", str(tmp_path), "--arms", "tepo-sparse"])
