"""Multi-LLM filtering (TAPO-hard): keep a question only if enough judges answer it correctly.

TAPO asked GPT-4o, DeepSeek-V3 and Gemini 2.5 Pro, each "equipped with our search API and
code interpreter", and kept the questions all three answered correctly. Here:

1. Each judge is an OpenAI-compatible endpoint offered our tools through function calling:
   `search(query)` and `code(code)`, executed by our own services through the `Tool`
   protocol; a tool's own failure (the code raised, nothing found) goes back to the judge as the
   tool's message, but an outage of the service (`ToolResult.infrastructure`) fails the stage.
2. A judge may call tools in `max_tool_turns` turns; the next request sets `tool_choice:
   "none"`, so it must answer. The answer is the last `\\boxed{}` of its final message.
3. Correctness is our reward verifier for the problem's source/type (`pipeline.reward`),
   the same one training uses; a score >= `correct_threshold` counts.
4. A row is kept when `min_correct` judges (0 = all) are right. A row is rejected for what it
   holds, never for an outage: a judge that cannot be reached or used (`JudgeUnavailable`, after
   its retries and within `deadline_s`) or a tool service that is down fails the stage with an
   error naming it, and the first such failure stops every call still running (a hanging judge
   costs one deadline, not one per row). Only a request refused for its content (`JudgeRefused`)
   counts as not correct for that row; it is not cached, so a later run asks again.
5. Every answer is cached in SQLite as soon as it arrives (see judge_cache.py); tokens and cost
   are summed from the cached answers, so report.json does not depend on what was cached.
6. A judge that answers but is broken fails the stage too (`pipeline.data.broken.BrokenDependency`): one that
   gives no readable (boxed) answer to any question, or refuses every request, and a tool of the judges whose
   every answer shows nothing (no results, empty, failed). The answers this run cached from it are forgotten,
   so the run after the fix asks again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from tqdm import tqdm

from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig
from pipeline.config.reward import RewardConfig
from pipeline.data.broken import BrokenDependency, refuse_if_all_useless
from pipeline.data.judge_cache import JudgeAnswer, JudgeCache, cache_key
from pipeline.data.judge_client import ChatClient, JudgeError, JudgeRefused, JudgeUnavailable
from pipeline.data.sources import Rejection
from pipeline.protocols.answers import last_boxed
from pipeline.reward import route, verify
from pipeline.tools.base import Tool
from pipeline.types import Problem, ToolResult

SYSTEM_PROMPT = (
    "You are a careful expert. Answer the user's question. You may call the tools you are given: "
    "`search` looks up facts on the web, `code` runs Python and returns what it prints. "
    "When you are done, give only the final answer inside \\boxed{}, e.g. \\boxed{42} or \\boxed{Paris}."
)
TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "search": {"type": "function", "function": {
        "name": "search", "description": "Search the web; returns the top passages.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    "code": {"type": "function", "function": {
        "name": "code", "description": "Run a Python program; returns its standard output.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
}
ToolFactory = Callable[[], Mapping[str, Tool]]
T = TypeVar("T")


def default_tools(cfg: MultiLLMConfig) -> dict[str, Tool]:
    """Clients of the configured services (a tool without a URL is not offered)."""
    tools: dict[str, Tool] = {}
    if cfg.search_url:
        from pipeline.tools.search import SearchClient

        tools["search"] = SearchClient(cfg.search_url)
    if cfg.code_url:
        from pipeline.tools.code import CodeSandboxClient

        tools["code"] = CodeSandboxClient(cfg.code_url)
    return tools


class ToolUnavailable(JudgeUnavailable):
    """A tool service the judges call is down: their answers would be about the outage, not the row."""


class WatchedTool:
    """A tool of the judges whose answers are kept, to tell a broken service (nothing useful, ever) from a
    question it cannot help with."""

    def __init__(self, tool: Tool, service: str) -> None:
        self.tool, self.name, self.service = tool, tool.name, service
        self.results: list[ToolResult] = []

    async def __call__(self, call_input: str) -> ToolResult:
        result = await self.tool(call_input)
        self.results.append(result)
        return result

    async def aclose(self) -> None:
        await self.tool.aclose()


def watched_tools(tools: Mapping[str, Tool], cfg: MultiLLMConfig) -> dict[str, WatchedTool]:
    urls = {"search": cfg.search_url, "code": cfg.code_url}
    return {name: WatchedTool(tool, f"the judges' {name} tool" + (f" at {urls[name]}" if urls.get(name) else ""))
            for name, tool in tools.items()}


def judge_chat_client(judge: JudgeConfig, cfg: MultiLLMConfig) -> ChatClient:
    return ChatClient(judge, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, backoff_s=cfg.backoff_s,
                      connect_timeout_s=cfg.connect_timeout_s, deadline_s=cfg.deadline_s)


async def all_or_outage(coros: Iterable[Awaitable[T]]) -> list[T]:
    """Every result, in order; the first exception (an outage) cancels the calls still running and is
    raised. Answers that came in before it are already in the cache."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _call_tool(tools: Mapping[str, Tool], call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    name, raw_args = fn.get("name"), fn.get("arguments") or "{}"
    if not isinstance(name, str) or name not in tools:
        return f"error: unknown tool {name!r}; available: {sorted(tools)}"
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else dict(raw_args)
        arg = args["query" if name == "search" else "code"]
    except (ValueError, KeyError, TypeError):
        return f"error: arguments of {name} must be JSON with a '{'query' if name == 'search' else 'code'}' string"
    try:
        result = await tools[name](str(arg))
    except Exception as err:  # a Tool must not raise: one that does is broken, not the row
        raise ToolUnavailable(f"tool {name!r} of the judges raised {type(err).__name__}: {err}") from err
    if result.infrastructure:
        raise ToolUnavailable(f"tool service {name!r} of the judges is unavailable: {result.error or result.output}")
    return result.output


async def ask_judge(client: ChatClient, question: str, tools: Mapping[str, Tool], cfg: MultiLLMConfig) -> JudgeAnswer:
    """One question to one judge, tool calls executed, until it answers (raises JudgeUnavailable or JudgeRefused)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    schemas = [TOOL_SCHEMAS[name] for name in sorted(tools)]
    prompt_tokens = completion_tokens = tool_calls = requests = 0
    for turn in range(cfg.max_tool_turns + 1):
        final = turn == cfg.max_tool_turns
        body: dict[str, Any] = {"messages": messages, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
        if schemas:
            # The last turn still declares the tools (some servers refuse a history with tool calls
            # otherwise) but forbids calling them, so the judge must answer.
            body["tools"] = schemas
            if final:
                body["tool_choice"] = "none"
        reply = await client.complete(body)
        prompt_tokens += reply.prompt_tokens
        completion_tokens += reply.completion_tokens
        requests += reply.attempts
        calls = reply.message.get("tool_calls") or []
        if not calls or final:
            content = reply.message.get("content") or ""
            return JudgeAnswer(last_boxed(content), content, prompt_tokens, completion_tokens, tool_calls, requests)
        messages.append({"role": "assistant", "content": reply.message.get("content"), "tool_calls": calls})
        for call in calls:
            tool_calls += 1
            output = await _call_tool(tools, call)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
    raise JudgeError("unreachable: the last turn offers no tools")  # pragma: no cover


def judge_key(judge: JudgeConfig, problem: Problem, cfg: MultiLLMConfig, tool_names: list[str]) -> str:
    return cache_key({"v": 1, "judge": judge.name, "model": judge.model, "system": SYSTEM_PROMPT,
                      "question": problem.question, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens,
                      "max_tool_turns": cfg.max_tool_turns, "tools": tool_names})


class JudgePanel:
    """Asks every judge about every problem, at most `concurrency` requests at once, via the cache."""

    def __init__(self, cfg: MultiLLMConfig, cache: JudgeCache, tools: Mapping[str, Tool]) -> None:
        self.cfg = cfg
        self.cache = cache
        self.tools = tools
        self.cache_hits = 0
        self.written: list[tuple[str, str, JudgeAnswer]] = []  # (judge, key, answer) cached by this run
        self._limit = asyncio.Semaphore(cfg.concurrency)
        self._clients = {j.name: judge_chat_client(j, cfg) for j in cfg.judges}

    async def answer(self, judge: JudgeConfig, problem: Problem) -> JudgeAnswer | JudgeError:
        key = judge_key(judge, problem, self.cfg, sorted(self.tools))
        cached = self.cache.get(key)
        if cached is not None:
            self.cache_hits += 1
            return cached
        async with self._limit:
            try:
                answer = await ask_judge(self._clients[judge.name], problem.question, self.tools, self.cfg)
            except JudgeRefused as err:  # this row's request; an outage (JudgeUnavailable) propagates
                return err
        self.cache.put(key, judge.name, problem.id, answer)
        self.written.append((judge.name, key, answer))
        return answer

    def forget(self, judge: str | None = None, *, tool_users: bool = False) -> None:
        """Drop what this run cached from `judge`, or (`tool_users`) every answer that called a tool."""
        self.cache.forget([key for name, key, answer in self.written
                           if name == judge or (tool_users and answer.tool_calls > 0)])

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self._clients.values())

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()


def _correct(problem: Problem, answer: JudgeAnswer | JudgeError, kind: str, threshold: float) -> bool:
    if isinstance(answer, JudgeError) or answer.predicted is None:
        return False
    return verify(kind, answer.predicted, list(problem.answers)) >= threshold


def _verdict(problem: Problem, answers: list[JudgeAnswer | JudgeError], cfg: MultiLLMConfig) -> str | None:
    """None if the row is kept, else the rejection reason."""
    kind = route(problem, RewardConfig())
    marks = [_correct(problem, a, kind, cfg.correct_threshold) for a in answers]
    need = cfg.min_correct or len(cfg.judges)
    if sum(marks) >= need:
        return None
    details = []
    for judge, answer, ok in zip(cfg.judges, answers, marks, strict=True):
        said = f"error ({answer})" if isinstance(answer, JudgeError) else repr((answer.predicted or "")[:60])
        details.append(f"{judge.name}: {'right' if ok else 'wrong'} {said}")
    return f"{sum(marks)}/{len(marks)} judges correct, {need} needed ({'; '.join(details)})"


def _totals(cfg: MultiLLMConfig, problems: list[Problem], results: list[list[JudgeAnswer | JudgeError]]) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for j, judge in enumerate(cfg.judges):
        answers = [row[j] for row in results]
        ok = [a for a in answers if isinstance(a, JudgeAnswer)]
        prompt, completion = sum(a.prompt_tokens for a in ok), sum(a.completion_tokens for a in ok)
        kinds = [route(p, RewardConfig()) for p in problems]
        totals[judge.name] = {
            "questions": len(answers),
            "correct": sum(_correct(p, a, k, cfg.correct_threshold) for p, a, k in zip(problems, answers, kinds, strict=True)),
            "errors": len(answers) - len(ok),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "tool_calls": sum(a.tool_calls for a in ok),
            "cost_usd": round((prompt * judge.input_usd_per_mtok + completion * judge.output_usd_per_mtok) / 1e6, 6),
        }
    return totals


def refuse_broken(cfg: MultiLLMConfig, rows: list[list[JudgeAnswer | JudgeError]], panel: JudgePanel,
                  tools: Mapping[str, WatchedTool]) -> None:
    """Raise `BrokenDependency` for a tool of the judges that never answered anything useful, or a judge that
    gave no readable answer to any question (see the module), after forgetting what this run cached from it."""
    for tool in tools.values():
        try:
            refuse_if_all_useless(tool.service, tool.results, "the judges")
        except BrokenDependency:
            panel.forget(tool_users=True)
            raise
    for j, judge in enumerate(cfg.judges):
        answers = [row[j] for row in rows]
        if answers and not any(isinstance(a, JudgeAnswer) and a.predicted is not None for a in answers):
            panel.forget(judge.name)
            said = str(answers[0]) if isinstance(answers[0], JudgeError) else answers[0].content.strip()
            raise BrokenDependency(
                f"judge {judge.name!r} (model {judge.model} at {judge.base_url}) gave no readable answer (one in "
                f"\\boxed{{}}) to any of its {len(answers)} questions (e.g. {said[:120]!r}); its answers were "
                "not kept. Nothing was written.")


async def _judge_all(problems: list[Problem], cfg: MultiLLMConfig, tool_factory: ToolFactory) -> tuple[
        list[list[JudgeAnswer | JudgeError]], dict[str, float]]:
    cache = JudgeCache(cfg.cache_path)
    try:
        tools = watched_tools(tool_factory(), cfg)
        panel = JudgePanel(cfg, cache, tools)  # fails at once on a missing API key variable
    except BaseException:
        cache.close()
        raise
    bar = tqdm(total=len(problems) * len(cfg.judges), desc="judges", unit="call", disable=not sys.stderr.isatty(), leave=False)

    async def one(judge: JudgeConfig, problem: Problem) -> JudgeAnswer | JudgeError:
        result = await panel.answer(judge, problem)
        bar.update(1)
        return result

    started = time.perf_counter()
    n = len(cfg.judges)
    try:
        flat = await all_or_outage(one(j, p) for p in problems for j in cfg.judges)
        refuse_broken(cfg, [list(flat[i * n:(i + 1) * n]) for i in range(len(problems))], panel, tools)
    finally:
        bar.close()
        await panel.aclose()
        for tool in tools.values():
            await tool.aclose()
        cache.close()
    elapsed = time.perf_counter() - started
    stats = {"judge_requests": float(panel.requests), "judge_cache_hits": float(panel.cache_hits),
             "judge_wall_s": elapsed, "judged_questions_per_s": len(problems) / elapsed if elapsed > 0 else 0.0}
    return [list(flat[i * n:(i + 1) * n]) for i in range(len(problems))], stats


def run_async(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even when the caller already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())  # type: ignore[arg-type]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # e.g. called from inside an async flow
        return pool.submit(lambda: asyncio.run(make())).result()  # type: ignore[arg-type]


def judge_filter(problems: list[Problem], cfg: CurateConfig, tool_factory: ToolFactory | None = None) -> tuple[
        list[Problem], list[Rejection], dict[str, dict[str, float]], dict[str, float]]:
    """Judge the rows of `judge: true` sources; pass the others through untouched."""
    judged_sources = {s.name for s in cfg.sources if s.judge}
    todo = [p for p in problems if p.source in judged_sources]
    factory = tool_factory or (lambda: default_tools(cfg.multi_llm))
    results, stats = run_async(lambda: _judge_all(todo, cfg.multi_llm, factory)) if todo else ([], {})
    rejected_ids: dict[str, Rejection] = {}
    for problem, answers in zip(todo, results, strict=True):
        reason = _verdict(problem, answers, cfg.multi_llm)
        if reason:
            rejected_ids[problem.id] = Rejection.of(problem, "judges", reason)
    kept = [p for p in problems if p.id not in rejected_ids]
    rejected = [rejected_ids[p.id] for p in todo if p.id in rejected_ids]
    return kept, rejected, _totals(cfg.multi_llm, todo, results), stats
