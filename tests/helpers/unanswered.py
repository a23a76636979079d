"""A code tool that never answers, for the tests that stop a rollout while a tool call is pending: it prints
"called" (the test's cue to stop the process) and runs `on_call` (a test may cancel its rollout there)."""

from __future__ import annotations

import asyncio


class Unanswered:
    name = "code"
    on_call = staticmethod(lambda: None)

    async def __call__(self, code: str) -> None:
        print("called", flush=True)
        self.on_call()
        await asyncio.Event().wait()

    async def aclose(self) -> None:
        pass
