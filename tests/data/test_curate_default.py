"""The default params curate offline, quickly, and byte-identically on re-run."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import load_config
from pipeline.jsonl import read_problems


def test_default_params_curate_calculator_only(repo_root: Path, tmp_path: Path) -> None:
    from pipeline.data.curate import run

    cfg = load_config(repo_root / "params.yaml", {"curate.output_dir": str(tmp_path / "a")}).curate
    assert cfg.sources == ()  # the default pipeline must not need the shared data
    report = run(cfg)
    train = read_problems(tmp_path / "a" / "train.jsonl")
    test = read_problems(tmp_path / "a" / "test.jsonl")
    assert (report.n_train, report.n_test) == (len(train), len(test)) == (cfg.calculator.n_train, cfg.calculator.n_test)
    assert {p.type for p in train + test} == {"calculator"}
    assert not {p.id for p in train} & {p.id for p in test}
    assert (tmp_path / "a" / "rejected.jsonl").exists() and (tmp_path / "a" / "report.json").exists()

    again = cfg.model_copy(update={"output_dir": str(tmp_path / "b")})
    run(again)
    for name in ("train.jsonl", "test.jsonl", "rejected.jsonl", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
