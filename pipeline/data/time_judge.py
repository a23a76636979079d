"""Optional LLM check for time-ambiguous questions, after the rule set (filters.TIME_CUES).

The rules catch explicit cues ("current", "this year"); an LLM also catches implicit ones
("who is the president of France?"). `filters.time_judge` names one of the `multi_llm.judges`;
it is asked, for every remaining row of `time_ambiguous_types`, to answer YES (the answer
depends on when the question is asked) or NO. YES rejects the row (filter `time_ambiguous`).

Same machinery as the multi-LLM stage: the SQLite cache (a re-run pays nothing), retries,
concurrency limit, token and cost accounting. A request refused for its content rejects the
row, is not cached and is retried by the next run: nothing unverified is kept. An unreachable
judge (`JudgeUnavailable`) fails the stage instead: no row is rejected for an outage, and so does a judge that
answers but never says YES or NO (`BrokenDependency`, its cached replies of this run forgotten).
"""

from __future__ import annotations

import asyncio
import sys
import time

from tqdm import tqdm

from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig
from pipeline.data.broken import BrokenDependency
from pipeline.data.judge_cache import JudgeAnswer, JudgeCache, cache_key
from pipeline.data.judge_client import ChatClient, JudgeError, JudgeRefused
from pipeline.data.judging import all_or_outage, judge_chat_client, run_async
from pipeline.data.sources import Rejection
from pipeline.types import Problem

TIME_PROMPT = (
    "You screen quiz questions. Reply YES if the correct answer to the user's question depends on when it "
    "is asked: it refers to the present or the latest of something (who currently holds an office, the most "
    "recent winner, how many so far) and states no date that fixes it. Reply NO if the answer is the same "
    "whenever it is asked. Reply with exactly one word: YES or NO."
)


def _key(judge: JudgeConfig, problem: Problem) -> str:
    return cache_key({"v": 1, "task": "time-ambiguity", "judge": judge.name, "model": judge.model,
                      "prompt": TIME_PROMPT, "question": problem.question})


def refuse_if_never_clear(judge: JudgeConfig, problems: list[Problem], results: list[JudgeAnswer | JudgeError],
                          cache: JudgeCache) -> None:
    """A time judge that said neither YES nor NO to any question is broken: forget its replies, fail naming it."""
    if not results or any(isinstance(r, JudgeAnswer) and r.predicted is not None for r in results):
        return
    cache.forget([_key(judge, p) for p in problems])
    said = str(results[0]) if isinstance(results[0], JudgeError) else results[0].content
    raise BrokenDependency(f"time judge {judge.name!r} (model {judge.model} at {judge.base_url}) said neither YES "
                           f"nor NO to any of its {len(results)} questions (e.g. {said[:120]!r}); its replies were "
                           "not kept. Nothing was written.")


async def _classify(client: ChatClient, cache: JudgeCache, judge: JudgeConfig, problem: Problem,
                    limit: asyncio.Semaphore, cfg: MultiLLMConfig) -> JudgeAnswer | JudgeError:
    key = _key(judge, problem)
    cached = cache.get(key)
    if cached is not None:
        return cached
    body = {"messages": [{"role": "system", "content": TIME_PROMPT}, {"role": "user", "content": problem.question}],
            "temperature": 0.0, "max_tokens": 8}
    async with limit:
        try:
            reply = await client.complete(body)
        except JudgeRefused as err:  # an outage (JudgeUnavailable) propagates and fails the stage
            return err
    content = (reply.message.get("content") or "").strip()
    word = content.split()[0].strip(".!").upper() if content else ""
    answer = JudgeAnswer(word if word in ("YES", "NO") else None, content, reply.prompt_tokens,
                         reply.completion_tokens, 0, reply.attempts)
    cache.put(key, judge.name, problem.id, answer)
    return answer


async def _classify_all(problems: list[Problem], judge: JudgeConfig, cfg: MultiLLMConfig) -> tuple[
        list[JudgeAnswer | JudgeError], float]:
    cache = JudgeCache(cfg.cache_path)
    try:
        client = judge_chat_client(judge, cfg)
    except BaseException:
        cache.close()
        raise
    limit = asyncio.Semaphore(cfg.concurrency)
    bar = tqdm(total=len(problems), desc="time judge", unit="q", disable=not sys.stderr.isatty(), leave=False)

    async def one(problem: Problem) -> JudgeAnswer | JudgeError:
        result = await _classify(client, cache, judge, problem, limit, cfg)
        bar.update(1)
        return result

    try:
        results = await all_or_outage(one(p) for p in problems)
        refuse_if_never_clear(judge, problems, results, cache)
    finally:
        bar.close()
        await client.aclose()
        cache.close()
    return list(results), float(client.requests)


def time_judge_filter(problems: list[Problem], cfg: CurateConfig) -> tuple[
        list[Problem], list[Rejection], dict[str, dict[str, float]], dict[str, float]]:
    """Ask the configured time judge about rows of the time-filtered types; reject the YES ones."""
    judge = next(j for j in cfg.multi_llm.judges if j.name == cfg.filters.time_judge)
    todo = [p for p in problems if p.type in cfg.filters.time_ambiguous_types]
    started = time.perf_counter()
    results, requests = run_async(lambda: _classify_all(todo, judge, cfg.multi_llm)) if todo else ([], 0.0)
    rejected: dict[str, Rejection] = {}
    for problem, result in zip(todo, results, strict=True):
        if isinstance(result, JudgeError):
            rejected[problem.id] = Rejection.of(problem, "time_ambiguous", f"time judge {judge.name}: error ({result})")
        elif result.predicted != "NO":
            said = "YES" if result.predicted == "YES" else f"unclear reply {result.content[:40]!r}"
            rejected[problem.id] = Rejection.of(problem, "time_ambiguous", f"time judge {judge.name}: {said}")
    answers = [r for r in results if isinstance(r, JudgeAnswer)]
    prompt, completion = sum(a.prompt_tokens for a in answers), sum(a.completion_tokens for a in answers)
    totals = {f"{judge.name}/time_ambiguity": {
        "questions": len(todo), "ambiguous": len(rejected), "errors": len(results) - len(answers),
        "prompt_tokens": prompt, "completion_tokens": completion, "tool_calls": 0,
        "cost_usd": round((prompt * judge.input_usd_per_mtok + completion * judge.output_usd_per_mtok) / 1e6, 6)}}
    stats = {"time_judge_requests": requests, "time_judge_wall_s": time.perf_counter() - started}
    kept = [p for p in problems if p.id not in rejected]
    return kept, [rejected[p.id] for p in todo if p.id in rejected], totals, stats
