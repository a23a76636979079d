"""The LLM judge against a scripted OpenAI-compatible server on loopback: verdicts, cache, failures."""

from __future__ import annotations

import pytest

from pipeline.config.evaluate import EvalJudgeConfig
from pipeline.data.judge_client import JudgeUnavailable
from pipeline.evaluation.benchmarks import Benchmark
from pipeline.evaluation.evaluate import evaluate_engine
from pipeline.evaluation.judge import judge_prompt, parse_verdict
from pipeline.jsonl import iter_json_lines
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import Problem
from tests.data.openai_server import Script, ScriptedOpenAIServer
from tests.evaluation.conftest import make_cfg
from tests.evaluation.helpers import PerQuestionLM

FACTS = {  # question -> (gold, what the scripted policy answers)
    "Who was the 16th US president?": ("Abraham Lincoln", "Honest Abe"),
    "What is the capital of France?": ("Paris", "Lyon"),
    "What is the capital of Italy?": ("Rome", "Rome"),
}
JUDGE_MODEL = "judge-1"


def fact_benchmark() -> Benchmark:
    problems = tuple(Problem(f"nq-{i}", q, (gold,), "fact", "nq", "test") for i, (q, (gold, _)) in enumerate(FACTS.items()))
    return Benchmark("nq", "fact", "scripted", problems, 0)


def prompt_of(question: str) -> str:
    gold, predicted = FACTS[question]
    return judge_prompt(question, [gold], predicted)


def evaluate_judged(tok, out_dir, judge: EvalJudgeConfig) -> dict:
    scripts = {q: [f"<think>recall</think> <answer>{pred}</answer>"] for q, (_, pred) in FACTS.items()}
    cfg = make_cfg(out_dir, mode="no_tools", judge=judge, plots=False)
    engine = RolloutEngine(PerQuestionLM(tok, scripts), tok, {}, cfg.rollout)
    return evaluate_engine(cfg, engine, [fact_benchmark()], model_name="scripted", model_id="scripted-v1")


def judge_cfg(url: str, tmp_path, **kw) -> EvalJudgeConfig:
    return EvalJudgeConfig(enabled=True, base_url=url, model=JUDGE_MODEL, cache_path=str(tmp_path / "judge.sqlite"),
                           backoff_s=0.0, **kw)


def script() -> Script:
    return Script(answers={prompt_of("Who was the 16th US president?"): "yes",
                           prompt_of("What is the capital of France?"): "no"})


def test_judge_accepts_an_alias_the_rules_reject_and_caches(tok, tmp_path) -> None:
    with ScriptedOpenAIServer(script()) as server:
        metrics = evaluate_judged(tok, tmp_path / "a", judge_cfg(server.url, tmp_path))
        assert server.requests[JUDGE_MODEL] == 2  # the rule-correct answer is never sent
        assert metrics["nq/accuracy"] == pytest.approx(2 / 3)
        assert metrics["nq/accuracy_rule"] == pytest.approx(1 / 3)
        assert metrics["nq/judge_accepted"] == 1
        rows = {r["question"]: r for _, r in iter_json_lines(tmp_path / "a" / "eval_samples.jsonl")}
        lincoln = rows["Who was the 16th US president?"]
        assert lincoln["judged"] is True and lincoln["score"] == 1.0 and lincoln["rule_score"] == 0.0
        assert rows["What is the capital of France?"]["score"] == 0.0
        again = evaluate_judged(tok, tmp_path / "b", judge_cfg(server.url, tmp_path))
        assert server.requests[JUDGE_MODEL] == 2  # every verdict came from the cache
        assert again["nq/accuracy"] == metrics["nq/accuracy"]


@pytest.mark.parametrize("outage", ["answers 503", "killed"])
def test_judge_outage_stops_the_run_and_a_resume_judges_the_chunk_again(tok, tmp_path, outage) -> None:
    """An outage never scores a sample: the run fails naming the judge, the chunk is not stored."""
    if outage == "killed":  # a port that was served and is no longer: connection refused
        with ScriptedOpenAIServer(script()) as dead:
            url = dead.url
    else:
        down = ScriptedOpenAIServer(Script(answers={}, status={JUDGE_MODEL: 503}))
        url = down.url
        down.__enter__()
    try:
        with pytest.raises(JudgeUnavailable, match=r"judge 'eval-judge'.*chunk 1 of nq"):
            evaluate_judged(tok, tmp_path / "a", judge_cfg(url, tmp_path, max_retries=1))
    finally:
        if outage != "killed":
            down.__exit__(None, None, None)
    samples = tmp_path / "a" / "eval_samples.jsonl"
    assert not samples.exists() or [r for _, r in iter_json_lines(samples)] == []
    with ScriptedOpenAIServer(script()) as server:
        metrics = evaluate_judged(tok, tmp_path / "a", judge_cfg(server.url, tmp_path))
        assert server.requests[JUDGE_MODEL] == 2  # nothing was cached for the outage
    assert metrics["nq/accuracy"] == pytest.approx(2 / 3) and metrics["nq/judge_accepted"] == 1


def test_a_request_refused_for_its_content_keeps_the_rule_score_and_is_not_cached(tok, tmp_path) -> None:
    refusing = Script(answers={}, status={JUDGE_MODEL: 400})
    with ScriptedOpenAIServer(refusing) as server:
        metrics = evaluate_judged(tok, tmp_path / "a", judge_cfg(server.url, tmp_path, max_retries=1))
        assert server.requests[JUDGE_MODEL] == 2  # refusals are not retried
    assert metrics["nq/accuracy"] == pytest.approx(1 / 3)
    rows = [r for _, r in iter_json_lines(tmp_path / "a" / "eval_samples.jsonl")]
    assert sum("HTTP 400" in r.get("judge_error", "") for r in rows) == 2
    with ScriptedOpenAIServer(script()) as server:
        metrics = evaluate_judged(tok, tmp_path / "b", judge_cfg(server.url, tmp_path))
        assert server.requests[JUDGE_MODEL] == 2
    assert metrics["nq/accuracy"] == pytest.approx(2 / 3)


def test_judge_disabled_adds_nothing(tok, tmp_path) -> None:
    metrics = evaluate_judged(tok, tmp_path, EvalJudgeConfig())
    assert "nq/accuracy_rule" not in metrics and metrics["nq/accuracy"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(("reply", "verdict"), [("\\boxed{yes}", True), ("So: \\boxed{ No }", False),
                                                ("yes", None), (None, None), ("\\boxed{no} \\boxed{yes}", True)])
def test_parse_verdict(reply, verdict) -> None:
    assert parse_verdict(reply) is verdict


def test_enabled_judge_needs_an_endpoint() -> None:
    with pytest.raises(ValueError, match="judge.enabled needs"):
        EvalJudgeConfig(enabled=True)
