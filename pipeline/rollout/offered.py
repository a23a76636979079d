"""Which tools a prompt offers: those its problem type may use (TAPO's routing) that the run provides."""

from __future__ import annotations

from pipeline.types import Problem, ToolName

# Which tools a problem type may use (TAPO gives fact questions search, computation code).
TOOLS_FOR_TYPE: dict[str, tuple[ToolName, ...]] = {
    "calculator": ("code",),
    "math": ("code",),
    "code": ("code",),
    "fact": ("search",),
    "multihop": ("search",),
    "complex": ("search", "code"),
}


def tools_for(problem: Problem, available: tuple[ToolName, ...]) -> tuple[ToolName, ...]:
    """The tools a prompt offers: those the problem type may use and the run provides."""
    return tuple(t for t in TOOLS_FOR_TYPE.get(problem.type, ()) if t in available)
