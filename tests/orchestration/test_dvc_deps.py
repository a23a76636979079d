"""dvc.yaml's code deps are what each stage really runs: the import closure of its flow, plus that of the
services it starts, by folder. Nothing missing (a change to code a stage runs re-runs it) and nothing
extra (a change to evaluation code does not re-run training).

The closure is read from the source with `ast` (every import, function-level ones included), so it
over-approximates what a run imports, never under-approximates it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.config.reward import RewardConfig
from tests.helpers.source_imports import imports

ROOT = Path(__file__).resolve().parents[2]
CODE_TREES = ("pipeline", "flows", "sandbox")
# The services a stage's flow starts as processes (flows/services.py), whose code is a dep too.
SERVICES = {"curate": ("sandbox.search",), "sft": ("sandbox.code", "sandbox.search"),
            "train": ("sandbox.code", "sandbox.search"),
            "evaluate": ("sandbox.code", "sandbox.search"), "evaluate-base": ("sandbox.code", "sandbox.search"),
            "evaluate-sft": ("sandbox.code", "sandbox.search")}


def _file_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base / "__main__.py"):
        if candidate.is_file() and candidate.parts[len(ROOT.parts)] in CODE_TREES:
            return candidate
    return None


def import_closure(*modules: str) -> set[Path]:
    """Every project file reached from `modules` through imports (parent packages included)."""
    seen: set[Path] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        path = _file_of(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        if path.name == "__init__.py" and (path.parent / "__main__.py").is_file() and module in modules:
            todo.append(module + ".__main__")
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [name for name, _, _ in imports(path, with_names=True)]
    return seen


def folder_deps(files: set[Path]) -> set[str]:
    """A file in a package below a code tree is named by its package's top folder; a file at a tree's top
    by itself."""
    deps = set()
    for path in files:
        rel = path.relative_to(ROOT)
        deps.add(str(Path(*rel.parts[:2])) if len(rel.parts) > 2 else str(rel))
    return deps


def expected_code_deps(stage_module: str, stage: str) -> set[str]:
    return folder_deps(import_closure(stage_module, *SERVICES.get(stage, ())))


def stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _flow_module(stage: dict) -> str:
    return stage["cmd"].split()[2]  # "python -m flows.<stage> --params params.yaml"


@pytest.mark.parametrize("name", list(stages()))
def test_a_stage_depends_on_exactly_the_code_it_runs(name: str) -> None:
    stage = stages()[name]
    declared = {d for d in stage["deps"] if d.split("/")[0] in CODE_TREES}
    expected = expected_code_deps(_flow_module(stage), _flow_module(stage).split(".")[1])
    assert declared == expected, (f"dvc.yaml stage {name}: missing {sorted(expected - declared)}, "
                                  f"not used {sorted(declared - expected)}")


def test_training_does_not_depend_on_evaluation_code() -> None:
    assert not any(d.startswith("pipeline/evaluation") for d in stages()["train"]["deps"])


def test_the_closure_follows_function_level_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipeline" / "a").mkdir(parents=True)
    (tmp_path / "pipeline" / "b").mkdir()
    for package in ("pipeline", "pipeline/a", "pipeline/b"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "pipeline" / "a" / "x.py").write_text("def f():\n    from pipeline.b.y import g\n")
    (tmp_path / "pipeline" / "b" / "y.py").write_text("def g(): ...\n")
    (tmp_path / "pipeline" / "c.py").write_text("")
    monkeypatch.setattr(__import__("sys").modules[__name__], "ROOT", tmp_path)
    assert folder_deps(import_closure("pipeline.a.x")) == {"pipeline/__init__.py", "pipeline/a", "pipeline/b"}


@pytest.mark.parametrize("name", ["evaluate-base", "evaluate-sft"])
def test_a_baselines_evaluation_depends_on_every_scoring_key_and_not_on_how_the_policy_learns(name: str) -> None:
    """So a preset that only trains otherwise (TEPO) reuses the base and SFT evaluations instead of re-running them,
    and a new reward key is not forgotten here. The training-only keys shape how the policy learns (pipeline.rl),
    which the evaluation of a fixed model does not run."""
    params = set(stages()[name]["params"])
    scoring = {f"reward.{key}" for key in RewardConfig.model_fields} - {f"reward.{k}" for k in RewardConfig.TRAINING_ONLY}
    assert {p for p in params if p.split(".")[0] == "reward"} == scoring
    assert not any(d.startswith("pipeline/rl") for d in stages()[name]["deps"])


def test_the_policys_evaluation_depends_on_what_names_its_row() -> None:
    params = set(stages()["evaluate"]["params"])
    named_after = {"reward", "train.algorithm", "train.init_model", "train.update.mask_tool_output", "train.output_dir",
                   "sft.init_model", "sft.output_dir"}  # pipeline.evaluation.labels.policy_label
    assert named_after <= params
