"""Which tools a prompt offers: the built-in ones its problem type may use (TAPO's routing) that the run provides,
and every user tool of the registry (`rollout.tools`: they are offered to every problem)."""

from __future__ import annotations

from pipeline.types import BUILTIN_TOOLS, Problem, ToolName

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
    """The tools a prompt offers: the built-in ones the problem type may use and the run provides, then the user
    tools the run provides."""
    routed = tuple(t for t in TOOLS_FOR_TYPE.get(problem.type, ()) if t in available)
    return routed + tuple(t for t in available if t not in BUILTIN_TOOLS)
