"""Functions the registry tests register as `kind: python` tools (by their import path, as a user would)."""

from __future__ import annotations

import asyncio
import threading
import time

IN_FLIGHT = {"now": 0, "most": 0}
_LOCK = threading.Lock()


def lookup(word: str, n: int = 1) -> str:
    return f"{word}: " + "; ".join(f"sense {i + 1}" for i in range(n))


async def weigh(items: list[str]) -> dict:
    await asyncio.sleep(0)
    return {"count": len(items), "longest": max(items, key=len) if items else None}


def broken(word: str) -> str:
    raise KeyError(word)


def slow(seconds: float) -> str:
    with _LOCK:
        IN_FLIGHT["now"] += 1
        IN_FLIGHT["most"] = max(IN_FLIGHT["most"], IN_FLIGHT["now"])
    time.sleep(seconds)
    with _LOCK:
        IN_FLIGHT["now"] -= 1
    return "done"


NOT_CALLABLE = 42
