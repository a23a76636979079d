"""Curation with its judge endpoint down: unreachable, failing, hanging, answering garbage, or killed
mid-run (a real process SIGKILLing itself). Each fails the stage naming the judge after its retries,
within the call's deadline; no row is rejected for it and nothing is written, and the answers that
came before are cached, so the re-run after the endpoint recovers pays only for the rest.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from pipeline.config.curate import CurateConfig, FilterConfig, JudgeConfig, MultiLLMConfig, SourceConfig
from pipeline.data.curate import run as curate
from pipeline.data.judge_cache import JudgeCache
from pipeline.data.judge_client import JudgeUnavailable
from pipeline.services.processes import ServiceProcess, free_port
from tests.faults.conftest import PYTHON, healthy, stage_env, wait_for

pytestmark = pytest.mark.integration  # a judge service that fails

QUESTIONS = {f"What is {i} plus {i}?": str(2 * i) for i in range(1, 9)}


def _curate_config(tmp_path: Path, url: str, *, time_judge: bool = False, **multi: object) -> CurateConfig:
    qfile = tmp_path / "hard.jsonl"
    qfile.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in QUESTIONS.items()))
    multi = {"backoff_s": 0.0, "max_retries": 1, "timeout_s": 2.0, "deadline_s": 30.0, "concurrency": 2} | multi
    return CurateConfig(
        calculator={"n_train": 0, "n_test": 0},
        sources=(SourceConfig(name="hard", path=str(qfile), adapter="hotpotqa", type="fact", split="train",
                              judge=not time_judge),),
        filters=FilterConfig(contamination_ngram=0, time_judge="m" if time_judge else "", time_ambiguous_types=("fact",)),
        multi_llm=MultiLLMConfig(judges=(JudgeConfig(name="m", base_url=url, model="m"),),
                                 cache_path=str(tmp_path / "cache.sqlite"), **multi),
        output_dir=str(tmp_path / "out"))


@pytest.mark.parametrize("time_judge", [False, True], ids=["multi-llm", "time-judge"])
@pytest.mark.parametrize("outage", ["refused", 500, 502, 503, 504, 429, 408, "malformed", "hanging"])
def test_a_judge_that_is_down_fails_curation_and_rejects_no_row(tmp_path: Path, scripted, outage, time_judge) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    if outage != "refused":
        scripted.status = {"malformed": 200, "hanging": 0}.get(outage, outage)
        scripted.body = b'{"choices": []}'
        url = scripted.url + "/v1"
    cfg = _curate_config(tmp_path, url, time_judge=time_judge, timeout_s=0.5, deadline_s=5.0)
    with pytest.raises(JudgeUnavailable, match="judge 'm'"):
        curate(cfg, tool_factory=dict)
    assert not (tmp_path / "out").exists()  # nothing written: no row rejected, DVC records nothing


def test_a_hanging_judge_costs_one_deadline_not_one_per_retry(tmp_path: Path, scripted) -> None:
    """A long read timeout does not matter: the call's deadline ends it, and the first unreachable call stops
    the stage's others (with the old client this hung for timeout_s x attempts per call)."""
    scripted.status = 0
    cfg = _curate_config(tmp_path, scripted.url + "/v1", timeout_s=3600.0, max_retries=4, deadline_s=1.0,
                         concurrency=2)
    with pytest.raises(JudgeUnavailable, match="deadline of 1s"):
        curate(cfg, tool_factory=dict)
    # the calls in flight when the first deadline passed, and at most one more each: not 8 questions x 5 attempts
    assert scripted.requests <= 2 * 2
    defaults = MultiLLMConfig()
    assert defaults.deadline_s <= 300 and defaults.connect_timeout_s <= 10  # vs ~615 s per call before


def test_a_judge_killed_mid_run_fails_the_stage_and_the_rerun_pays_only_the_rest(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"answers": QUESTIONS, "die_after": 3}))
    command = [PYTHON, "-m", "tests.data.openai_server", "--port", str(port), "--script", str(script)]
    judge = ServiceProcess("judge", command, port, tmp_path / "judge.log", env=stage_env())
    cfg = _curate_config(tmp_path, f"http://127.0.0.1:{port}/v1", concurrency=1)
    with judge.start(timeout_s=60):
        with pytest.raises(JudgeUnavailable, match="judge 'm'.*unreachable"):
            curate(cfg, tool_factory=dict)  # the judge SIGKILLs itself after its third answer
        assert judge.process.wait(60) == -signal.SIGKILL
    assert not (tmp_path / "out").exists()
    assert len(JudgeCache(cfg.multi_llm.cache_path)) == 3  # what was answered is kept
    script.write_text(json.dumps({"answers": QUESTIONS}))
    with ServiceProcess("judge", command, port, tmp_path / "judge2.log", env=stage_env()).start(timeout_s=60):
        report = curate(cfg, tool_factory=dict)
    assert report.n_train == len(QUESTIONS) and report.run_stats["judge_cache_hits"] == 3


def test_the_judge_server_helper_really_dies(tmp_path: Path) -> None:
    """The helper above: a real process that SIGKILLs itself, so a test cannot pass on a judge that lives."""
    port = free_port()
    (tmp_path / "s.json").write_text(json.dumps({"answers": {"q": "a"}, "die_after": 1}))
    proc = subprocess.Popen([PYTHON, "-m", "tests.data.openai_server", "--port", str(port), "--script",
                             str(tmp_path / "s.json")], env=stage_env())
    wait_for(lambda: _answers(port), "the judge server")
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).status_code == 200
    assert proc.wait(60) == -signal.SIGKILL


def _answers(port: int) -> bool:
    return healthy(f"http://127.0.0.1:{port}/health")
