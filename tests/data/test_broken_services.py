"""A dependency that answers but is broken fails the stage, naming it, instead of an empty or one-sided output.

Found curating with a search service that was up but answered nothing: curate exited 0 with all 218 fact questions
rejected as unanswerable (0 kept; a normal run keeps 111). The class: every answer of a service is a plausible
verdict on one row, all of them together a fact about the service. Here each dependency of curation and of the SFT
teacher is a real loopback HTTP service (the project's own clients talk to it) that answers every call uselessly:
a search service that finds nothing, refuses every query, or serves the wrong index; judges that box no answer
or give no verdict; the judges' search tool; a sandbox that fails every program. The stage fails naming the
service (and, for a filter, the source and the reason), writes nothing, and keeps no answer of the broken one.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import ConfigError, load_config
from pipeline.config.curate import CurateConfig, JudgeConfig, MultiLLMConfig, SourceConfig
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.search import SearchConfig
from pipeline.data.answerable import service_probe
from pipeline.data.broken import BrokenDependency, refuse_degenerate_rejections
from pipeline.data.curate import run as curate
from pipeline.data.judge_cache import JudgeCache
from pipeline.data.sources import Rejection
from pipeline.protocols import protocol_of
from pipeline.sft import scripted_traces
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import Problem, ToolResult
from tests.data.openai_server import Script, ScriptedOpenAIServer
from tests.helpers.loopback import serving
from tests.helpers.tiny import tiny_tokenizer

FACTS = {"What is the capital of Algeria?": "Algiers", "Who wrote Hamlet?": "William Shakespeare",
         "What is the chemical symbol of gold?": "Au", "Which planet is known as the Red Planet?": "Mars"}


def search_service(answer: dict) -> type[BaseHTTPRequestHandler]:
    """A search service (GET /health, POST /search) that answers every search with `answer`: {"status", "body"};
    a body of None answers each query with a passage that shows its fact's answer (a healthy index)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._send(200, {"status": "ok"})

        def do_POST(self) -> None:  # noqa: N802
            query = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))["query"]
            body = answer["body"] if answer["body"] is not None else {"results": [
                {"title": "Fact", "text": f"The answer to {query} is {FACTS.get(query, 'unknown')}."}]}
            self._send(answer["status"], body)

    return Handler


BROKEN_SEARCH = {  # what a search service that is up can answer every query with, uselessly
    "finds-nothing": {"status": 200, "body": {"results": []}},  # an empty index
    "refuses-all": {"status": 422, "body": {"detail": "query refused"}},
    "wrong-index": {"status": 200, "body": {"results": [{"title": "Aardvark", "text": "The aardvark is a mammal."}]}},
}


@contextlib.contextmanager
def search_at(kind: str) -> Iterator[str]:
    answer = {"status": 200, "body": None} if kind == "healthy" else dict(BROKEN_SEARCH[kind])
    with serving(search_service(answer)) as url:
        yield url


def test_default_curation_against_a_search_service_that_finds_nothing_fails_naming_it(repo_root: Path,
                                                                                      tmp_path: Path) -> None:
    """The reported case: the default params (calculator and the embedded dump's 218 fact questions, kept only when
    the search service answers them) against a search service that is up and finds nothing."""
    full = load_config(repo_root / "params.yaml", {"curate.output_dir": str(tmp_path / "out")})
    with search_at("finds-nothing") as url:
        probe = service_probe(full.search, url, full.rollout.max_tool_output_chars)
        with pytest.raises(BrokenDependency, match=f"search service at {url} .* none of the 21[0-8] calls"):
            curate(full.curate, search=probe)
    assert not (tmp_path / "out").exists()


def fact_source(tmp_path: Path, **source: object) -> SourceConfig:
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in FACTS.items()))
    return SourceConfig(name="facts", path=str(path), adapter="hotpotqa", type="fact", split="train", **source)


@pytest.mark.parametrize("kind", sorted(BROKEN_SEARCH))
def test_a_search_service_answering_every_question_uselessly_fails_curation(tmp_path: Path, kind: str) -> None:
    cfg = CurateConfig(calculator={"n_train": 2, "n_test": 2}, sources=(fact_source(tmp_path, answerable_only=True),),
                       filters={"contamination_ngram": 0}, output_dir=str(tmp_path / "out"))
    with search_at(kind) as url:
        probe = service_probe(SearchConfig(), url, 500)
        # each names the service; the wrong index answers, so the filter's share names the source and reason too
        reason = "filter 'unanswerable' rejected 4 of the 4 rows of source 'facts'.*" if kind == "wrong-index" else ""
        with pytest.raises(BrokenDependency, match=f"{reason}search service at {url}"):
            curate(cfg, search=probe)
        assert not (tmp_path / "out").exists()
    with search_at("healthy") as url:  # the same curation against a working service keeps every fact
        assert curate(cfg, search=service_probe(SearchConfig(), url, 500)).per_source["facts"]["train"] == 4


@given(read=st.integers(1, 60), data=st.data(), share=st.floats(0.05, 1.0))
def test_a_filter_fails_the_stage_exactly_past_its_share_or_on_a_whole_source(read: int, data: st.DataObject,
                                                                              share: float) -> None:
    """Past `curate.max_rejected_share` of one source's rows, or all of them, for one filter: the error names the
    source, the filter, one reason and what decides it; below, or spread over filters and sources, it passes."""
    rejected = data.draw(st.integers(0, read))
    other = data.draw(st.integers(0, read - rejected))  # another filter's rejections of the same source
    rows = [Rejection.of(Problem(f"p{i}", "q?", ("a",), "fact", "src", "train"), "unanswerable", "shows none")
            for i in range(rejected)]
    rows += [Rejection.of(Problem(f"o{i}", "q?", ("a",), "fact", "src", "train"), "duplicate", "dup")
             for i in range(other)]
    degenerate = rejected > 0 and (rejected == read or rejected > share * read)
    degenerate |= other > 0 and (other == read or other > share * read)
    try:
        refuse_degenerate_rejections(rows, rows, {"src": read, "calm": 100}, share, "the search service at X")
    except BrokenDependency as err:
        assert degenerate, str(err)
        assert "source 'src'" in str(err) and "decided by the search service at X" in str(err)
        assert "'unanswerable'" in str(err) or "'duplicate'" in str(err)
    else:
        assert not degenerate


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_the_share_is_validated(repo_root: Path, share: float) -> None:
    with pytest.raises(ConfigError, match="curate.max_rejected_share"):
        load_config(repo_root / "params.yaml", {"curate.max_rejected_share": share})


def judged(tmp_path: Path, url: str, models: list[str], **multi: object) -> CurateConfig:
    judges = tuple(JudgeConfig(name=m, base_url=url, model=m) for m in models)
    return CurateConfig(calculator={"n_train": 0, "n_test": 0}, sources=(fact_source(tmp_path, judge=True),),
                        filters={"contamination_ngram": 0, "time_ambiguous": False},
                        multi_llm=MultiLLMConfig(judges=judges, cache_path=str(tmp_path / "judges.sqlite"),
                                                 backoff_s=0.0, **{"min_correct": 1, **multi}),
                        output_dir=str(tmp_path / "out"))


@pytest.mark.parametrize("says", ["", "I would rather not say.", "The answer is 42."])
def test_a_judge_that_boxes_no_answer_fails_curation_and_is_asked_again_once_fixed(tmp_path: Path, says: str) -> None:
    """Another judge answering right keeps every row (min_correct 1): the broken one would go unnoticed."""
    script = Script(answers=dict(FACTS), says={"mute": says})
    with ScriptedOpenAIServer(script) as server:
        cfg = judged(tmp_path, server.url, ["steady", "mute"])
        with pytest.raises(BrokenDependency, match=r"judge 'mute' \(model mute at .*/v1\) gave no readable answer"):
            curate(cfg, tool_factory=dict)
        assert not (tmp_path / "out").exists()
        assert len(JudgeCache(cfg.multi_llm.cache_path)) <= len(FACTS)  # at most steady's answers: none of mute's
        del script.says["mute"]  # the endpoint is fixed
        report = curate(cfg, tool_factory=dict)
        assert server.requests["mute"] == 2 * len(FACTS)  # asked again: its broken answers were not kept
    assert report.n_train == len(FACTS) and report.judges["mute"]["correct"] == len(FACTS)


def test_a_time_judge_that_never_says_yes_or_no_fails_curation(tmp_path: Path) -> None:
    script = Script(answers={}, says={"clock": "It depends."})
    with ScriptedOpenAIServer(script) as server:
        cfg = CurateConfig(calculator={"n_train": 0, "n_test": 0}, sources=(fact_source(tmp_path),),
                           filters={"time_judge": "clock", "contamination_ngram": 0},
                           multi_llm={"judges": [{"name": "clock", "base_url": server.url, "model": "clock"}],
                                      "cache_path": str(tmp_path / "c.sqlite"), "backoff_s": 0.0},
                           output_dir=str(tmp_path / "out"))
        with pytest.raises(BrokenDependency, match="time judge 'clock' .* neither YES nor NO to any of its 4"):
            curate(cfg)
        assert len(JudgeCache(tmp_path / "c.sqlite")) == 0 and not (tmp_path / "out").exists()


def test_the_judges_search_tool_finding_nothing_fails_curation(tmp_path: Path) -> None:
    """The searcher answers 'unknown' without its search, the plain judge keeps every row: only the tool's answers
    show the break. The answers that called it are forgotten; the plain judge's are kept."""
    script = Script(answers=dict(FACTS), tool={"searcher": "search"})
    with ScriptedOpenAIServer(script) as server, search_at("finds-nothing") as url:
        cfg = judged(tmp_path, server.url, ["searcher", "plain"], search_url=url)
        with pytest.raises(BrokenDependency, match=f"the judges' search tool at {url} answered none of the 4"):
            curate(cfg)
        assert len(JudgeCache(cfg.multi_llm.cache_path)) == len(FACTS)  # plain's answers only
        with search_at("healthy") as fixed:
            good = cfg.model_copy(update={"multi_llm": cfg.multi_llm.model_copy(update={"search_url": fixed})})
            report = curate(good)
        assert server.requests["plain"] == len(FACTS)  # not asked twice
    assert report.judges["searcher"]["correct"] == len(FACTS) and report.judges["searcher"]["tool_calls"] == 4


def sandbox_service(answer: dict) -> type[BaseHTTPRequestHandler]:
    """A code sandbox (POST /run) answering every program with `answer`."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class InProcessCode:
    """A working code tool: runs the generator's own (trusted) program here."""

    name = "code"

    async def __call__(self, call_input: str) -> ToolResult:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(call_input, {})  # noqa: S102
        return ToolResult(out.getvalue(), ok=True)

    async def aclose(self) -> None:
        pass


BROKEN_SANDBOX = {"fails-everything": {"status": "error", "stdout": "", "error": "ImportError: no module"},
                  "prints-nothing": {"status": "ok", "stdout": "", "error": None}}


@pytest.mark.parametrize("broken", ["search:finds-nothing", "search:wrong-index", "code:fails-everything",
                                    "code:prints-nothing"])
def test_the_sft_teacher_fails_naming_a_tool_service_that_answers_nothing_useful(broken: str) -> None:
    """The other tool works, so traces would be made: the teacher used to train on that one tool alone."""
    from pipeline.data.calculator import generate_splits

    tool, kind = broken.split(":")
    calculator, _ = generate_splits(4, 0, 0, (1,))
    facts = [Problem(f"f{i}", q, (a,), "fact", "wiki_facts", "train") for i, (q, a) in enumerate(FACTS.items())]
    with contextlib.ExitStack() as stack:
        if tool == "search":
            url = stack.enter_context(search_at(kind))
            tools = {"code": InProcessCode(), "search": SearchClient(url, retries=0)}
        else:
            url = stack.enter_context(serving(sandbox_service(BROKEN_SANDBOX[kind])))
            tools = {"code": CodeSandboxClient(url, retries=0), "search": SearchClient(
                stack.enter_context(search_at("healthy")), retries=0)}
        n = len(facts) if tool == "search" else len(calculator)
        with pytest.raises(BrokenDependency, match=f"the {tool} service at {url} answered none of the {n} calls"):
            scripted_traces(calculator + facts, tiny_tokenizer(), protocol_of(RolloutConfig()), tools,
                            RewardConfig(), 500)


@pytest.mark.parametrize("kind", ["finds-nothing", "refuses-all"])
def test_a_stage_that_offers_search_refuses_a_service_that_finds_nothing_for_its_own_questions(
        repo_root: Path, tmp_path: Path, kind: str) -> None:
    """train and evaluate ask the search service their own questions first (`running_services`): each was kept by
    curation because search answered it, so a service that finds nothing for any (an empty index, refusing every
    query) is broken, not the policy's queries. A working service passes. (A wrong index that finds something is
    curation's to catch: a benchmark's questions need not be answerable from the index.)"""
    from flows.services import running_services
    from pipeline.data.answerable import search_probes

    problems = [Problem(id=f"f{i}", question=q, answers=(a,), type="fact", source="facts", split="train")
                for i, (q, a) in enumerate(FACTS.items())]
    probes = search_probes(problems + [Problem(id="c", question="1+1", answers=("2",), type="calculator", split="train",
                                                     source="calc")])
    assert probes == problems
    for state in (kind, "healthy"):
        with search_at(state) as url:
            cfg = load_config(repo_root / "params.yaml", {"search.url": url, "search.redis_url": "redis://127.0.0.1:1"})
            services = running_services(cfg, ("search",), log_dir=tmp_path, search_probe=probes, stage="train")
            if state == "healthy":
                with services as urls:
                    assert urls == {"search": url}
            else:
                with pytest.raises(BrokenDependency, match=f"search service at {url} .* start-up probe of train"):
                    with services:
                        pass
