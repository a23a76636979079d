"""An optional LLM judge for answers the rule-based verifier rejects (ARPO and TEPO judge fact QA).

Only samples whose verifier kind is in `judge.kinds`, whose answer was extracted and whose
rule score is not already correct are sent. The judge sees the question, the gold answers and
the prediction and must reply `\\boxed{yes}` or `\\boxed{no}`; a yes sets the sample's score
to 1, and `rule_score` keeps the verifier's. Verdicts are cached in SQLite keyed by judge
model and prompt, committed as they arrive, so a re-run or a resumed run never asks twice.

Failures are told apart by whose fault they are (`pipeline.data.judge_client`), so a sample is
never scored wrong for an outage: a judge that cannot answer (unreachable, 5xx or timeouts after
its retries, a wrong key or URL) raises `JudgeUnavailable` out of `judge_records`, the other
requests in flight are cancelled and the evaluation stops before the chunk is stored, so a resumed
run judges it again (the verdicts that did arrive are cached). A request the endpoint refuses for
its content (HTTP 400/413/422) or a reply without a verdict leaves that sample's rule score and
records `judge_error`; it is not cached, so the next run asks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

from pipeline.config.curate import JudgeConfig
from pipeline.config.evaluate import EvalJudgeConfig
from pipeline.data.judge_client import ChatClient, JudgeRefused

SYSTEM = "You grade answers to questions. Reply with \\boxed{yes} or \\boxed{no} and nothing else."
_VERDICT = re.compile(r"\\boxed\{\s*(yes|no)\s*\}", re.IGNORECASE)


def judge_prompt(question: str, gold: list[str], predicted: str) -> str:
    golds = "; ".join(gold)
    return (f"Question: {question}\nAccepted answers: {golds}\nPredicted answer: {predicted}\n"
            "Does the predicted answer mean the same as one of the accepted answers? "
            "Reply \\boxed{yes} or \\boxed{no}.")


def parse_verdict(text: str | None) -> bool | None:
    found = _VERDICT.findall(text or "")
    return found[-1].lower() == "yes" if found else None


class VerdictCache:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, verdict INTEGER NOT NULL)")

    @staticmethod
    def key(model: str, prompt: str) -> str:
        return hashlib.sha256(f"{model}\n{SYSTEM}\n{prompt}".encode()).hexdigest()

    def get(self, key: str) -> bool | None:
        row = self._db.execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
        return None if row is None else bool(row[0])

    def put(self, key: str, verdict: bool) -> None:
        self._db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?)", (key, int(verdict)))
        self._db.commit()

    def close(self) -> None:
        self._db.close()


def needs_judge(record: dict[str, Any], kinds: tuple[str, ...]) -> bool:
    return record["verifier"] in kinds and record["predicted"] is not None and record["score"] <= 0.9


async def _ask(client: ChatClient, prompt: str, key: str, cache: VerdictCache, limit: asyncio.Semaphore
               ) -> bool | str:
    """The verdict (cached as it arrives), or why this sample has none; `JudgeUnavailable` propagates."""
    async with limit:
        try:
            reply = await client.complete({"messages": [{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": prompt}],
                                           "temperature": 0.0, "max_tokens": 16})
        except JudgeRefused as err:  # this request's content, not the endpoint: this sample alone
            return str(err)
    verdict = parse_verdict(reply.message.get("content"))
    if verdict is None:
        return f"no verdict in reply {str(reply.message.get('content'))[:100]!r}"
    cache.put(key, verdict)
    return verdict


async def _ask_all(client: ChatClient, jobs: list[tuple[str, str]], cache: VerdictCache,
                   limit: asyncio.Semaphore) -> list[bool | str]:
    """Ask for every (prompt, key); the first outage cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_ask(client, prompt, key, cache, limit)) for prompt, key in jobs]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


async def _judge(records: list[dict[str, Any]], cfg: EvalJudgeConfig) -> None:
    todo = [r for r in records if needs_judge(r, cfg.kinds)]
    if not todo:
        return
    cache = VerdictCache(Path(cfg.cache_path))
    client = ChatClient(JudgeConfig(name="eval-judge", base_url=cfg.base_url, model=cfg.model,
                                    api_key_env=cfg.api_key_env),
                        timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, backoff_s=cfg.backoff_s)
    limit = asyncio.Semaphore(cfg.concurrency)
    try:
        prompts = [judge_prompt(r["question"], r["gold"], r["predicted"]) for r in todo]
        keys = [VerdictCache.key(cfg.model, p) for p in prompts]
        cached = [cache.get(k) for k in keys]
        jobs = [(p, k) for p, k, c in zip(prompts, keys, cached) if c is None]
        answers = iter(await _ask_all(client, jobs, cache, limit))
        for record, hit in zip(todo, cached):
            verdict = hit if hit is not None else next(answers)
            if isinstance(verdict, str):
                record["judge_error"] = verdict
                continue
            record["judged"] = True
            record["score"] = 1.0 if verdict else record["score"]
    finally:
        await client.aclose()
        cache.close()


async def judge_records(records: list[dict[str, Any]], cfg: EvalJudgeConfig) -> list[dict[str, Any]]:
    """Judge the eligible records in place (score, rule_score, judged, judge_error) and return them;
    raises `JudgeUnavailable` when the judge cannot answer (see the module)."""
    if not cfg.enabled:
        return records
    for r in records:
        r.setdefault("rule_score", r["score"])
        r.setdefault("judged", False)
    await _judge(records, cfg)
    return records
