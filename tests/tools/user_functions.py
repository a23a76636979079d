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


RELEASE = threading.Event()  # set by the tests' teardown: lets every hung call return
CALLS = {"hang": 0}


def hang(seconds: float = 3600.0) -> str:
    """Hangs (as a tool stuck on a lock or a dead socket would) until RELEASE, at most `seconds`."""
    with _LOCK:
        CALLS["hang"] += 1
    RELEASE.wait(seconds)
    return "released"


def stops() -> str:
    raise StopIteration("a generator's end escaped")


def exits() -> str:
    raise SystemExit(3)


def lone_surrogate(word: str = "") -> str:
    return "\ud83d" + word


def huge(n: int) -> str:
    return "x" * n
