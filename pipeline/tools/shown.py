"""How the engine shows a tool output: the one definition the rollout (which inserts it) and the
scorer (which must recognise it, `pipeline.reward.format.shown_as`) share. No dependencies, so
both environments (the main one and vLLM's) import it."""

from __future__ import annotations

CUT_MARK = "\n...\n"  # what the engine puts between the head and the tail of a cut tool output


def cut_middle(text: str, limit: int) -> str:
    """Keep head and tail of an over-long tool output (ToRL/TAPO show both ends)."""
    if len(text) <= limit:
        return text
    return cut_at(text, (limit - len(CUT_MARK)) // 2)


def cut_at(text: str, half: int) -> str:
    """`half` characters of each end of `text` around the cut mark."""
    return f"{text[:half]}{CUT_MARK}{text[-half:]}"
