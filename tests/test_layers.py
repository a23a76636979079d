"""The import contract of docs/architecture.md: each part of the tree imports only the layers below it.

Read from the source with `ast` (nothing is imported), so a new upward import fails here whatever
runs it. An import under `if TYPE_CHECKING:` names a type for an annotation and is not a runtime
dependency; it is exempt from the order, and from nothing else (the third-party rule below counts it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers.source_imports import imports

ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A part may import the parts of any lower layer; within a layer, only what IN_LAYER names.
LAYERS: list[set[str]] = [
    {"pipeline.types", "pipeline.repeatable"},
    {"pipeline.paths", "pipeline.outputs", "pipeline.jsonl", "pipeline.config"},
    {"pipeline.tools", "pipeline.protocols", "pipeline.model", "pipeline.services"},
    {"pipeline.reward", "pipeline.rollout", "pipeline.inference", "pipeline.tracking"},
    {"pipeline.rl", "pipeline.data", "pipeline.training_run"},
    {"pipeline.trainer", "pipeline.sampling", "pipeline.evaluation"},
    {"pipeline.distributed"},
    {"pipeline.train", "pipeline.sft"},
    {"pipeline.export"},
]
IN_LAYER = {("pipeline.jsonl", "pipeline.types")}
# The services import only the bottom of the library (records, config, paths, JSONL); nothing in
# pipeline/ imports a service's code; the flows sit on top of everything.
SERVICE_MAY_IMPORT = {"pipeline.types", "pipeline.paths", "pipeline.jsonl", "pipeline.config"}
# pipeline/ is the library: orchestration and serving stay outside it (DEVELOPERS.md).
NEVER_IN_PIPELINE = ("prefect", "dvc", "fastapi", "uvicorn", "flows", "sandbox")


def part_of(module: str) -> str | None:
    """The part of the tree a module belongs to: `pipeline.<first level>`, `sandbox.<service>`, `flows`."""
    parts = module.split(".")
    if parts[0] == "flows":
        return "flows"
    if parts[0] in ("pipeline", "sandbox") and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0] if parts[0] in ("pipeline", "sandbox") else None


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def layer_of(part: str) -> int:
    for level, members in enumerate(LAYERS):
        if part in members:
            return level
    raise KeyError(part)


def source_files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def violations() -> list[str]:
    bad = []
    for top in ("pipeline", "sandbox", "flows"):
        for path in source_files(top):
            source = part_of(_module_name(path))
            for name, line, typing_only in imports(path):
                where = f"{path.relative_to(ROOT)}:{line}: {source} imports {name}"
                target = part_of(name)
                if top == "pipeline" and name.split(".")[0] in NEVER_IN_PIPELINE:
                    bad.append(f"{where} (the library imports no orchestration, service or flow code)")
                if target is None or target == source or typing_only or top == "flows":
                    continue
                if top == "sandbox":
                    if target.startswith("pipeline") and target not in SERVICE_MAY_IMPORT:
                        bad.append(f"{where} (a service imports only {sorted(SERVICE_MAY_IMPORT)})")
                    continue
                if target.startswith("pipeline") and (layer_of(target) > layer_of(source) or (
                        layer_of(target) == layer_of(source) and (source, target) not in IN_LAYER)):
                    bad.append(f"{where} (layer {layer_of(source)} may not import layer {layer_of(target)})")
    return bad


def test_every_part_of_the_library_has_a_layer() -> None:
    parts = {part_of(_module_name(p)) for p in source_files("pipeline")} - {"pipeline"}
    unplaced = sorted(p for p in parts if not any(p in layer for layer in LAYERS))
    assert not unplaced, f"add these to LAYERS here and to docs/architecture.md: {unplaced}"


def test_imports_follow_the_layers() -> None:
    assert violations() == []


def test_the_contract_is_the_documented_one() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = [part for layer in LAYERS for part in layer if f"`{part.removeprefix('pipeline.')}" not in text]
    assert not missing, f"docs/architecture.md does not place: {missing}"


@pytest.mark.parametrize(("source", "target", "ok"), [
    ("pipeline/rl/x.py", "pipeline.trainer.update", False),      # upward
    ("pipeline/trainer/x.py", "pipeline.rl.loss", True),         # downward
    ("pipeline/rollout/x.py", "pipeline.tracking.runs", False),  # sideways, not named in IN_LAYER
    ("pipeline/reward/x.py", "prefect", False),                  # orchestration in the library
    ("pipeline/rl/x.py", "sandbox.search.cache", False),         # service code in the library
    ("sandbox/search/x.py", "pipeline.rollout.engine", False),   # a service above the library's bottom
    ("sandbox/search/x.py", "pipeline.config.search", True),
])
def test_the_checker_catches_what_it_should(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            source: str, target: str, ok: bool) -> None:
    fake = tmp_path / source
    fake.parent.mkdir(parents=True)
    fake.write_text(f"import {target}\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    found = violations()
    assert (found == []) is ok, found
