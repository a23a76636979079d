"""Multi-LLM filtering against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import subprocess
import time
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig, SourceConfig
from pipeline.data.broken import BrokenDependency
from pipeline.data.curate import run
from pipeline.data.judge_cache import JudgeCache
from pipeline.data.judge_client import JudgeUnavailable
from pipeline.types import ToolResult
from tests.data.openai_server import Script, ScriptedOpenAIServer

QUESTIONS = {
    "What is the capital of France?": "Paris",
    "Who wrote Hamlet?": "William Shakespeare",
    "What is 123456 times 789?": "97406784",
    "How many days are in a leap year?": "366",
    "What is the chemical symbol of gold?": "Au",
    "Which planet is known as the Red Planet?": "Mars",
}
CORPUS = {q: f"Doc 1 (Title: Fact) The answer to '{q}' is {a}." for q, a in QUESTIONS.items()}


class CorpusSearch:
    """A search tool over a fixed corpus: our service's shape, without its index."""

    name = "search"

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def __call__(self, call_input: str) -> ToolResult:
        self.queries.append(call_input)
        return ToolResult(CORPUS.get(call_input, "No results found."), ok=True)

    async def aclose(self) -> None:
        pass


class PythonCode:
    """Runs the judge's (scripted, trusted) code in a fresh interpreter and returns stdout."""

    name = "code"

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self, call_input: str) -> ToolResult:
        self.runs += 1
        done = subprocess.run([sys.executable, "-c", call_input], capture_output=True, text=True, timeout=20)
        if done.returncode:
            return ToolResult.failure(done.stderr.strip().splitlines()[-1])
        return ToolResult(done.stdout, ok=True)

    async def aclose(self) -> None:
        pass


@pytest.fixture()
def questions_file(tmp_path: Path) -> Path:
    path = tmp_path / "hard.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS.items()))
    return path


def _config(tmp_path: Path, qfile: Path, url: str, models: list[str], **multi: object) -> CurateConfig:
    judges = tuple(JudgeConfig(name=m, base_url=url, model=m, input_usd_per_mtok=2.0, output_usd_per_mtok=8.0)
                   for m in models)
    multi_cfg = {"judges": judges, "cache_path": str(tmp_path / "cache" / "judges.sqlite"), "backoff_s": 0.0,
                 "concurrency": 4, **multi}
    return CurateConfig(
        calculator={"n_train": 0, "n_test": 0},
        sources=(SourceConfig(name="hard", path=str(qfile), adapter="hotpotqa", type="fact", split="train", judge=True),),
        filters={"contamination_ngram": 0},
        multi_llm=MultiLLMConfig(**multi_cfg),
        output_dir=str(tmp_path / "out"),
    )


@pytest.fixture()
def tools() -> Iterator[tuple[CorpusSearch, PythonCode]]:
    yield CorpusSearch(), PythonCode()


def _kept(tmp_path: Path) -> set[str]:
    return {json.loads(line)["question"] for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()}


def test_all_judges_must_be_right_and_tools_really_run(tmp_path: Path, questions_file: Path, tools) -> None:
    search, code = tools
    script = Script(answers=dict(QUESTIONS), tool={"searcher": "search", "coder": "code"},
                    wrong={"plain": {"Who wrote Hamlet?"}, "coder": {"Which planet is known as the Red Planet?"}})
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["searcher", "coder", "plain"])
        report = run(cfg, tool_factory=lambda: {"search": search, "code": code})
    expected = set(QUESTIONS) - {"Who wrote Hamlet?", "Which planet is known as the Red Planet?"}
    assert _kept(tmp_path) == expected
    assert report.per_filter["judges"] == 2
    assert len(search.queries) == len(QUESTIONS)  # searcher called search once per question
    assert code.runs == len(QUESTIONS) - 1  # coder skips the tool on the question it gets wrong
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert {r["filter"] for r in rejected} == {"judges"}
    hamlet = next(r for r in rejected if r["question"] == "Who wrote Hamlet?")
    assert "2/3 judges correct, 3 needed" in hamlet["reason"] and "plain: wrong" in hamlet["reason"]
    assert hamlet["line"] == 2 and hamlet["file"] == str(questions_file)
    totals = report.judges
    assert totals["searcher"]["correct"] == 6 and totals["coder"]["correct"] == 5
    assert totals["searcher"]["tool_calls"] == 6 and totals["plain"]["tool_calls"] == 0
    for t in totals.values():
        assert t["prompt_tokens"] > 0 and t["completion_tokens"] > 0
        expected_cost = (t["prompt_tokens"] * 2.0 + t["completion_tokens"] * 8.0) / 1e6
        assert t["cost_usd"] == pytest.approx(expected_cost, rel=1e-6)


def test_k_of_n_keeps_rows_most_judges_solve(tmp_path: Path, questions_file: Path) -> None:
    script = Script(answers=dict(QUESTIONS), wrong={"a": {"Who wrote Hamlet?"}, "b": {"Who wrote Hamlet?", "Which planet is known as the Red Planet?"}})
    with ScriptedOpenAIServer(script) as server:
        run(_config(tmp_path, questions_file, server.url, ["a", "b", "c"], min_correct=2), tool_factory=dict)
    assert _kept(tmp_path) == set(QUESTIONS) - {"Who wrote Hamlet?"}


def test_cache_means_a_rerun_pays_nothing_and_is_byte_identical(tmp_path: Path, questions_file: Path, tools) -> None:
    script = Script(answers=dict(QUESTIONS), tool={"searcher": "search"})
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["searcher", "plain"])
        first = run(cfg, tool_factory=lambda: {"search": tools[0]})
        sent = sum(server.requests.values())
        before = {n: (tmp_path / "out" / n).read_bytes() for n in ("train.jsonl", "rejected.jsonl", "report.json")}
        second = run(cfg, tool_factory=lambda: {"search": tools[0]})
        assert sum(server.requests.values()) == sent  # nothing asked twice
    assert sent == 6 * 2 + 6  # searcher: tool call + answer; plain: answer
    assert first.run_stats["judge_requests"] == sent and second.run_stats["judge_cache_hits"] == 12
    assert second.run_stats["judge_requests"] == 0
    assert {n: (tmp_path / "out" / n).read_bytes() for n in before} == before


def test_a_failing_endpoint_fails_the_stage_and_a_rerun_resumes(tmp_path: Path, questions_file: Path) -> None:
    """An outage (HTTP 503 after the retries) rejects no row: the stage fails naming the judge, nothing is
    written, and the answers already in are cached, so the rerun after the endpoint recovers pays only the rest."""
    script = Script(answers=dict(QUESTIONS), status={"flaky": 503}, latency_s=0.05)
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["steady", "flaky"], max_retries=1, concurrency=1)
        with pytest.raises(JudgeUnavailable, match="judge 'flaky'.*HTTP 503"):
            run(cfg, tool_factory=dict)
        assert server.requests["flaky"] == 2  # one try + one retry, then every other call is stopped
        assert not (tmp_path / "out").exists()
        cached = len(JudgeCache(cfg.multi_llm.cache_path))  # only the steady judge's answers, if any came first
        del script.status["flaky"]  # the endpoint recovers
        before = server.requests["steady"]
        report = run(cfg, tool_factory=dict)
        assert server.requests["steady"] - before == 6 - cached  # what was answered is not paid again
        assert server.requests["flaky"] == 2 + 6
    assert report.n_train == 6


def test_retries_with_backoff_recover_from_transient_errors(tmp_path: Path, questions_file: Path) -> None:
    script = Script(answers=dict(QUESTIONS), fail_first={"m": 2})
    with ScriptedOpenAIServer(script) as server:
        report = run(_config(tmp_path, questions_file, server.url, ["m"], max_retries=2), tool_factory=dict)
        assert server.requests["m"] == 3 * 6
    assert report.n_train == 6 and report.judges["m"]["errors"] == 0


def test_client_errors_fail_without_retrying(tmp_path: Path, questions_file: Path) -> None:
    """A request refused for its content is that row's (not retried); a judge that refuses every request is
    broken, not strict: the stage fails naming it and writes nothing."""
    script = Script(answers=dict(QUESTIONS), status={"m": 400})
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["m", "steady"], max_retries=3, min_correct=1)
        with pytest.raises(BrokenDependency, match=r"judge 'm' \(model m at .*\) gave no readable answer .* 6 "):
            run(cfg, tool_factory=dict)
        assert server.requests["m"] == 6 and not (tmp_path / "out").exists()


def test_api_key_is_sent_and_a_missing_variable_fails_at_once(tmp_path: Path, questions_file: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(answers=dict(QUESTIONS), api_key="sk-test")
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["m"])
        judge = cfg.multi_llm.judges[0].model_copy(update={"api_key_env": "TAPO_TEST_JUDGE_KEY"})
        cfg = cfg.model_copy(update={"multi_llm": cfg.multi_llm.model_copy(update={"judges": (judge,)})})
        monkeypatch.delenv("TAPO_TEST_JUDGE_KEY", raising=False)
        with pytest.raises(RuntimeError, match="TAPO_TEST_JUDGE_KEY"):
            run(cfg, tool_factory=dict)
        assert server.requests["m"] == 0
        monkeypatch.setenv("TAPO_TEST_JUDGE_KEY", "sk-test")
        assert run(cfg, tool_factory=dict).n_train == 6


def test_a_killed_run_resumes_without_paying_twice(tmp_path: Path, questions_file: Path, repo_root: Path) -> None:
    script = Script(answers=dict(QUESTIONS), latency_s=0.2)
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["m"], concurrency=1)
        params = tmp_path / "params.yaml"
        params.write_text(json.dumps({"extends": "defaults", "curate": cfg.model_dump(mode="json")}))  # JSON is YAML
        child = subprocess.Popen([sys.executable, "-c", "import sys; from pipeline.config import load_config; "
                                  "from pipeline.data.curate import run; run(load_config(sys.argv[1]).curate)", str(params)],
                                 cwd=repo_root)
        try:
            deadline = time.monotonic() + 60
            while (not Path(cfg.multi_llm.cache_path).exists() or len(JudgeCache(cfg.multi_llm.cache_path)) < 2):
                assert child.poll() is None and time.monotonic() < deadline, "judging finished or stalled"
                time.sleep(0.05)
        finally:
            child.kill()  # SIGKILL: no clean-up runs, as in a crash
            child.wait()
        time.sleep(0.1)  # let a request the child sent just before dying reach the server's counter
        cached = len(JudgeCache(cfg.multi_llm.cache_path))
        assert 2 <= cached < len(QUESTIONS) and not (tmp_path / "out" / "report.json").exists()
        before = server.requests["m"]
        report = run(cfg, tool_factory=dict)
        assert server.requests["m"] - before == len(QUESTIONS) - cached  # only the unanswered questions
    assert report.n_train == len(QUESTIONS) and report.run_stats["judge_cache_hits"] == cached


def test_time_judge_rejects_what_it_calls_time_ambiguous(tmp_path: Path) -> None:
    rows = {"who is the president of france?": "Emmanuel Macron", "who wrote the iliad?": "Homer",
            "how tall is mount everest?": "8849 m", "who is the current pope?": "Leo XIV"}
    qfile = tmp_path / "nq.jsonl"
    qfile.write_text("".join(json.dumps({"question": q, "answer": [a]}) + "\n" for q, a in rows.items()))
    script = Script(answers={}, verdicts={"clock": {"who is the president of france?", "how tall is mount everest?"}},
                    fail_first={"clock": 1})
    with ScriptedOpenAIServer(script) as server:
        cfg = CurateConfig(
            calculator={"n_train": 0, "n_test": 0},
            sources=(SourceConfig(name="nq", path=str(qfile), adapter="nq_open", type="fact", split="train"),),
            filters={"time_judge": "clock"},
            multi_llm={"judges": [{"name": "clock", "base_url": server.url, "model": "clock", "input_usd_per_mtok": 1.0}],
                       "cache_path": str(tmp_path / "c.sqlite"), "backoff_s": 0.0},
            output_dir=str(tmp_path / "out"),
        )
        report = run(cfg)
        assert server.requests["clock"] == 3 * 2  # the rules caught "current"; one retry each after a 503
        again = run(cfg)
        assert server.requests["clock"] == 6 and again.run_stats["time_judge_requests"] == 0
    assert _kept(tmp_path) == {"who wrote the iliad?"}
    reasons = {r["question"]: r["reason"] for r in map(json.loads, (tmp_path / "out" / "rejected.jsonl").read_text().splitlines())}
    assert reasons["who is the current pope?"] == "time cue 'current' and no explicit year"
    assert reasons["who is the president of france?"] == "time judge clock: YES"
    assert report.per_filter["time_ambiguous"] == 3
    totals = report.judges["clock/time_ambiguity"]
    assert totals["questions"] == 3 and totals["ambiguous"] == 2 and totals["cost_usd"] > 0


def test_a_judge_out_of_tool_turns_must_answer(tmp_path: Path, questions_file: Path, tools) -> None:
    script = Script(answers=dict(QUESTIONS), tool={"searcher": "search"})
    with ScriptedOpenAIServer(script) as server:
        # without its search it does not know: every row of the source is rejected, and the stage says so
        with pytest.raises(BrokenDependency, match="filter 'judges' rejected 6 of the 6 rows of source 'hard'.*"
                                                   "judge 'searcher'"):
            run(_config(tmp_path, questions_file, server.url, ["searcher"], max_tool_turns=0),
                tool_factory=lambda: {"search": tools[0]})
        assert server.requests["searcher"] == 6  # one request each: tools declared but tool_choice "none"
    assert tools[0].queries == [] and not (tmp_path / "out").exists()


class ExplodingSearch:
    name = "search"

    async def __call__(self, call_input: str) -> ToolResult:
        raise ConnectionError("backend fell over")

    async def aclose(self) -> None:
        pass


async def test_runs_inside_an_event_loop_and_a_raising_tool_fails_the_stage(tmp_path: Path,
                                                                            questions_file: Path) -> None:
    """Prefect (or any async caller) may call run() with a loop running; a tool that breaks its contract is
    broken infrastructure, not an observation: the judge's answer would be about it, so no row is judged."""
    script = Script(answers=dict(QUESTIONS), tool={"searcher": "search"})
    with ScriptedOpenAIServer(script) as server:
        cfg = _config(tmp_path, questions_file, server.url, ["searcher", "plain"], min_correct=1)
        with pytest.raises(JudgeUnavailable, match="tool 'search' of the judges raised ConnectionError"):
            run(cfg, tool_factory=lambda: {"search": ExplodingSearch()})
        assert not (tmp_path / "out").exists()
        report = run(cfg, tool_factory=lambda: {"search": CorpusSearch()})
    assert report.n_train == 6
