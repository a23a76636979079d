"""learning_cpu's bookkeeping: which stages a re-run keeps, and the paired SFT -> DAPO comparison."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.learning_cpu import COLD_START_FIELDS, QUICK, StageLog, paired_flips, rl_checkpoint_model, rl_config
from pipeline.trainer.run_folder import run_folder


def run_all(log: StageLog, calls: list[str]) -> None:
    for stage, fields in (("sft", COLD_START_FIELDS), ("rl", None)):
        log.run(stage, lambda stage=stage: calls.append(stage) or f"{stage} result", fields)


def test_a_rerun_keeps_finished_stages_and_an_rl_change_keeps_only_the_cold_start(tmp_path: Path) -> None:
    path, calls = tmp_path / "stages.json", []
    run_all(StageLog(path, QUICK), calls)
    run_all(StageLog(path, QUICK), calls)
    assert calls == ["sft", "rl"]
    run_all(StageLog(path, dataclasses.replace(QUICK, lr=QUICK.lr * 2, rl_seed=3)), calls)
    assert calls == ["sft", "rl", "rl"]
    run_all(StageLog(path, dataclasses.replace(QUICK, sft_traces=QUICK.sft_traces + 1)), calls)
    assert calls == ["sft", "rl", "rl", "sft", "rl"]
    log = StageLog(path, dataclasses.replace(QUICK, sft_traces=QUICK.sft_traces + 1))
    assert log.run("rl", lambda: pytest.fail("kept stage was run again")) == "rl result"
    assert list(log.seconds()) == ["rl"]  # only this invocation's stages count towards its time


def test_a_file_with_one_sizes_record_for_all_stages_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "stages.json"
    sizes = json.loads(json.dumps(dataclasses.asdict(QUICK)))
    del sizes["rl_seed"]  # written before the field existed
    path.write_text(json.dumps({"sizes": sizes, "stages": {"sft": {"seconds": 1.0, "result": "kept"}}}))
    assert StageLog(path, QUICK).run("sft", lambda: "again", COLD_START_FIELDS) == "kept"
    assert StageLog(path, QUICK).run("rl", lambda: "new") == "new"


def write_eval(directory: Path, scores: list[float]) -> Path:
    directory.mkdir()
    rows = [json.dumps({"id": f"p{i}", "score": s}) for i, s in enumerate(scores)]
    (directory / "eval_samples.jsonl").write_text("\n".join(rows) + "\n")
    return directory


def test_paired_flips_count_both_directions_with_an_exact_sign_test(tmp_path: Path) -> None:
    before = write_eval(tmp_path / "sft", [0, 0, 0, 0, 1, 1, 0.95])
    after = write_eval(tmp_path / "dapo", [1, 1, 1, 0, 0, 1, 1.0])
    flips = paired_flips(before, after)
    assert (flips["wrong_to_right"], flips["right_to_wrong"]) == (3, 1)
    assert flips["sign_test_p"] == pytest.approx(2 * (1 + 4) / 16)
    assert paired_flips(before, before)["sign_test_p"] == 1.0


def test_a_checkpoint_the_trainer_no_longer_keeps_is_named_with_those_it_kept(tmp_path: Path) -> None:
    cfg = rl_config(QUICK, tmp_path)
    for step in (30, 36):
        (run_folder(cfg) / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"--eval-checkpoint 20: .*step-000020 does not exist "
                                                r"\(kept: \['step-000030', 'step-000036'\]\)"):
        rl_checkpoint_model(cfg, 20, tmp_path / "dapo_step20")
