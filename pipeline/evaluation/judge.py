"""An optional LLM judge for answers the rule-based verifier rejects (ARPO and TEPO judge fact QA).

Only samples whose verifier kind is in `judge.kinds`, whose answer was extracted and whose
rule score is not already correct are sent. The judge sees the question, the gold answers and
the prediction and must reply `\\boxed{yes}` or `\\boxed{no}`; a yes sets the sample's score
to 1, and `rule_score` keeps the verifier's. Verdicts are cached in SQLite keyed by judge
model and prompt, committed as they arrive, so a re-run or a resumed run never asks twice.
A request that fails for good leaves the rule score and records `judge_error`; it is not
cached, so the next run asks again.
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
from pipeline.data.judge_client import ChatClient, JudgeError

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


async def _ask(client: ChatClient, prompt: str, limit: asyncio.Semaphore) -> bool | str:
    async with limit:
        try:
            reply = await client.complete({"messages": [{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": prompt}],
                                           "temperature": 0.0, "max_tokens": 16})
        except JudgeError as err:
            return str(err)
    verdict = parse_verdict(reply.message.get("content"))
    return verdict if verdict is not None else f"no verdict in reply {str(reply.message.get('content'))[:100]!r}"


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
        asked = await asyncio.gather(*(_ask(client, p, limit) for p, c in zip(prompts, cached) if c is None))
        answers = iter(asked)
        for record, key, hit in zip(todo, keys, cached):
            verdict = hit if hit is not None else next(answers)
            if isinstance(verdict, str):
                record["judge_error"] = verdict
                continue
            if hit is None:
                cache.put(key, verdict)
            record["judged"] = True
            record["score"] = 1.0 if verdict else record["score"]
    finally:
        await client.aclose()
        cache.close()


async def judge_records(records: list[dict[str, Any]], cfg: EvalJudgeConfig) -> list[dict[str, Any]]:
    """Judge the eligible records in place (score, rule_score, judged, judge_error) and return them."""
    if not cfg.enabled:
        return records
    for r in records:
        r.setdefault("rule_score", r["score"])
        r.setdefault("judged", False)
    await _judge(records, cfg)
    return records
