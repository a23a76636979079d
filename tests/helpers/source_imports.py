"""The absolute imports of a source file, read with `ast` (nothing is imported): the import contract
(tests/test_layers.py) and dvc.yaml's code deps (tests/orchestration/test_dvc_deps.py) read the same."""

from __future__ import annotations

import ast
from pathlib import Path


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def imports(path: Path, with_names: bool = False) -> list[tuple[str, int, bool]]:
    """(imported module, line, only for type checking) for every absolute import in a file; with
    `with_names`, `from m import n` also gives `m.n` (n may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = _type_checking_blocks(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + ([f"{node.module}.{alias.name}" for alias in node.names] if with_names else [])
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(name, node.lineno, id(node) in typing_only) for name in names]
    return found
