"""The import contract of docs/architecture.md: each part of the tree imports only the layers below it.

Read from the source with `ast` (nothing is imported), so a new upward import fails here whatever
runs it. An import under `if TYPE_CHECKING:` names a type for an annotation and is not a runtime
dependency; it is exempt from the order, and from nothing else (the third-party rule below counts it,
and so does the cycle check: two modules that import each other, even for an annotation or inside a
function, cannot be read one without the other).
"""

from __future__ import annotations

import ast
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


def module_graph(top: str) -> dict[str, set[str]]:
    """Every module of `top` -> the modules of `top` it imports: anywhere in the file (under `if TYPE_CHECKING:`,
    inside a function), `from m import n` meaning the module m.n where there is one, else m."""
    modules = {_module_name(path): path for path in source_files(top)}

    def module(name: str) -> str | None:  # the module an import names, or the package holding it
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else module(node.module)
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {module(a.name) for a in node.names}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: each strongly connected set of two or more modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_every_part_of_the_library_has_a_layer() -> None:
    parts = {part_of(_module_name(p)) for p in source_files("pipeline")} - {"pipeline"}
    unplaced = sorted(p for p in parts if not any(p in layer for layer in LAYERS))
    assert not unplaced, f"add these to LAYERS here and to docs/architecture.md: {unplaced}"


def test_imports_follow_the_layers() -> None:
    assert violations() == []


@pytest.mark.parametrize("top", ["pipeline", "flows"])
def test_no_module_imports_one_that_imports_it_back(top: str) -> None:
    """No import circle, however indirect, annotations included: each module can be read, and tested, from the
    modules below it alone."""
    assert cycles(module_graph(top)) == []


def test_the_cycle_check_finds_a_circle_hidden_behind_type_checking(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipeline" / "rollout").mkdir(parents=True)
    (tmp_path / "pipeline" / "rollout" / "a.py").write_text("from pipeline.rollout import b\n")
    (tmp_path / "pipeline" / "rollout" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                            "    from pipeline.rollout.c import C\n")
    (tmp_path / "pipeline" / "rollout" / "c.py").write_text("def f():\n    import pipeline.rollout.a\n")
    (tmp_path / "pipeline" / "rollout" / "d.py").write_text("import pipeline.rollout.a\n")  # imports, not in it
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert cycles(module_graph("pipeline")) == [["pipeline.rollout.a", "pipeline.rollout.b", "pipeline.rollout.c"]]


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


# Where the run's whole config may go: the stage recipes (train, sft, evaluation's run and its evaluation proper,
# which reads 7 of the 11 sections), the run's owner (a run's identity and inputs are digests of all of it) and the
# experiment overrides (a diff of two whole configs). Every other function is handed the sections or fields it
# reads (issue "each function gets what it reads").
WHOLE_CONFIG_READERS = {
    "pipeline/train.py", "pipeline/sft.py", "pipeline/evaluation/evaluate.py",
    "pipeline/training_run/plan.py", "pipeline/training_run/folder.py", "pipeline/training_run/inputs.py",
    "pipeline/config/overrides.py",
}


def whole_config_parameters(root: Path) -> dict[str, list[str]]:
    """{module: [function, ...]} for each function of pipeline/ with a parameter annotated `RunConfig`."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.annotation is not None and "RunConfig" in ast.unparse(a.annotation) for a in arguments):
                    found.setdefault(path.relative_to(root).as_posix(), []).append(node.name)
    return found


def test_the_whole_run_config_reaches_only_the_recipes_and_the_run_owner() -> None:
    readers = whole_config_parameters(ROOT)
    assert set(readers) <= WHOLE_CONFIG_READERS, {m: f for m, f in readers.items() if m not in WHOLE_CONFIG_READERS}


def test_the_config_reach_check_sees_a_leaf_that_takes_the_whole_config(tmp_path: Path) -> None:
    (tmp_path / "pipeline" / "tools").mkdir(parents=True)
    (tmp_path / "pipeline" / "tools" / "leaf.py").write_text(
        "from pipeline.config import RunConfig\n\ndef clients(cfg: 'RunConfig', urls: dict) -> list:\n    return []\n")
    assert whole_config_parameters(tmp_path) == {"pipeline/tools/leaf.py": ["clients"]}
