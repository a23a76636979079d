"""Which imports a snippet may use, checked before it runs and again while it runs.

This is a courtesy to the model, not the security boundary: it turns `import os` into a
clear one-line error instead of a run that fails deep inside the OS jail, and it keeps the
snippets on the scientific stack the workers pre-import. Everything it refuses is still
harmless if reached another way (numpy and sympy hand out `os`, `ctypes` and `subprocess`
as attributes); the jail in `sandbox.code.jail` is what makes it harmless.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType, ModuleType

# The list, scipy, and small pure-computation helpers that math code routinely uses.
ALLOWED_MODULES = frozenset({
    "math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "collections",
    "re", "datetime", "random", "numpy", "sympy", "scipy", "mpmath",
    "operator", "heapq", "bisect", "string", "typing", "copy", "numbers", "array", "time", "json",
    "dataclasses", "enum", "textwrap",
})
SNIPPET_FILENAME = "<snippet>"


def refusal_message(module: str) -> str:
    return f"module '{module}' is not allowed in the sandbox (allowed: {', '.join(sorted(ALLOWED_MODULES))})"


@dataclass(frozen=True)
class Compiled:
    code: CodeType


@dataclass(frozen=True)
class Refused:
    """The snippet was not run. `status` is "rejected" (policy) or "error" (does not compile)."""

    status: str
    error: str
    stderr: str


def _first_refused_import(tree: ast.AST) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")] if node.level else [node.module or ""]
        else:
            continue
        for name in names:
            if name.split(".")[0] not in ALLOWED_MODULES:
                return name
    return None


def prepare(source: str) -> Compiled | Refused:
    """Parse, check the imports and compile, all before anything is forked."""
    try:
        tree = ast.parse(source, SNIPPET_FILENAME, "exec")
        refused = _first_refused_import(tree)
        if refused is not None:
            message = f"ImportError: {refusal_message(refused)}"
            return Refused("rejected", message, message + "\n")
        return Compiled(compile(tree, SNIPPET_FILENAME, "exec", dont_inherit=True))
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as exc:
        # ValueError: NUL bytes; RecursionError/MemoryError: pathologically nested source.
        import traceback

        lines = traceback.format_exception_only(type(exc), exc)
        return Refused("error", lines[-1].strip(), "".join(lines))


def install_import_guard(snippet_globals: dict) -> None:
    """Refuse, at run time, imports made by the snippet's own code (`__import__('os')`).

    Imports made inside library modules (sympy importing its own submodules lazily) go
    through: their globals are a loaded module's namespace. Anything else (the snippet,
    `exec` with a fresh dict, sympify's eval namespace) is held to the list."""
    real_import: Callable = builtins.__import__
    modules = sys.modules

    def guarded_import(name: str, globals: Mapping[str, object] | None = None, locals: Mapping[str, object] | None = None,
                       fromlist: Sequence[str] | None = (), level: int = 0) -> ModuleType:
        caller = globals.get("__name__") if isinstance(globals, dict) else None
        from_snippet = globals is snippet_globals or not isinstance(caller, str) or caller == "__main__" or caller not in modules
        if from_snippet and (level != 0 or name.split(".")[0] not in ALLOWED_MODULES):
            raise ImportError(refusal_message(name), name=name)  # plain, so the model reads 'ImportError: ...'
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = guarded_import
