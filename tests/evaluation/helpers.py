"""Doubles for evaluation tests: a model that answers each question from its own script, and a
deterministic code tool (digits, + and * only)."""

from __future__ import annotations

import asyncio

from transformers import PreTrainedTokenizerFast

from pipeline.types import ToolResult
from tests.helpers.tiny import ScriptedLM

USER_OPEN, TURN_CLOSE = "<|im_start|>user\n", "<|im_end|>"


class PerQuestionLM(ScriptedLM):
    """`ScriptedLM` whose script is chosen by the question in the prompt (default: `fallback`).

    A question in `crash_on` raises, as a decoder crash (e.g. out of memory) would.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, scripts: dict[str, list[str]],
                 fallback: list[str] | None = None, crash_on: frozenset[str] = frozenset()) -> None:
        super().__init__(tokenizer, fallback or ["<answer>?</answer>"])
        self.scripts = {q: [tokenizer(s, add_special_tokens=False)["input_ids"] for s in segs]
                        for q, segs in scripts.items()}
        self.fallback_segments = self.segments
        self.crash_on = crash_on
        self.questions_seen: set[str] = set()
        self.prompts_seen: list[str] = []

    def _next_token(self, context: list[int]) -> int:
        text = self.tok.decode(context)
        if USER_OPEN not in text:  # the prompts' shared system turn alone (prefilled once): no question yet
            return super()._next_token(context)
        start = text.find(USER_OPEN) + len(USER_OPEN)
        question = text[start:text.find(TURN_CLOSE, start)]
        if question in self.crash_on:
            raise RuntimeError(f"simulated decoder crash on {question!r}")
        if question not in self.questions_seen:
            self.questions_seen.add(question)
            self.prompts_seen.append(text)
        self.segments = self.scripts.get(question, self.fallback_segments)
        return super()._next_token(context)


class ArithmeticTool:
    """Evaluates `print(<expr>)` with digits, + and * only; anything else is a NameError observation."""

    name = "code"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, code: str) -> ToolResult:
        self.calls.append(code)
        await asyncio.sleep(0)
        expr = code.removeprefix("print(").removesuffix(")")
        if not expr or not set(expr) <= set("0123456789*+ "):
            return ToolResult.failure("NameError: name is not defined")
        return ToolResult(str(eval(expr)), ok=True)  # noqa: S307 - digits, + and * only

    async def aclose(self) -> None:
        pass
