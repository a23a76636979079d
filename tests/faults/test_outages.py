"""Outages fail loudly, after trying to recover: real tool services killed mid-run.

* A tool client marks a failure as infrastructure exactly when the service is at fault (a matrix of
  real HTTP answers on loopback, a refused port, a service that does not answer in time).
* Training with the sandbox SIGKILLed mid-run stops, naming the service, before the batch is
  trained on; below the limits, the groups that read the outage are never trained on.
* The search service killed: infrastructure; Redis killed: the search service serves uncached.
* The services flow restarts a service that died, a bounded number of times, and logs it, and a
  call made meanwhile waits for it.
(The judges: test_judge_outages.py.)
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.train
from flows.services import running_services
from pipeline.config import load_config
from pipeline.config.search import SearchConfig
from pipeline.tools.outages import OutageCounts, OutageGuard, ToolOutage
from pipeline.paths import REPO_ROOT
from sandbox.search.build_index import build_index
from pipeline.services.processes import ServiceProcess, ServiceSupervisor, free_port, python_service, redis_service
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.factory import make_tools
from pipeline.tools.search import SearchClient
from pipeline.train import set_up
from pipeline.sampling.dynamic_sampling import outage_metrics
from tests.helpers.training import collect
from pipeline.types import ToolCall, ToolResult, Trajectory
from tests.faults.conftest import alive, healthy, sandbox_service, wait_for
from tests.train.toy_task import build_toy_model, toy_config

pytestmark = pytest.mark.integration  # services killed mid-run

# --- the clients' classification, against real HTTP answers --------------------------------------------


GOOD = {"code": json.dumps({"status": "ok", "stdout": "42\n"}).encode(),
        "search": json.dumps({"results": [{"title": "T", "text": "x"}]}).encode()}
# (HTTP status or 0 = no answer in time, body) -> is it the service's fault?
CASES = [(200, None, False), (200, b"not json", True), (200, b"[1, 2]", True), (400, b"{}", False),
         (413, b'{"detail": "too large"}', False), (422, b"{}", False), (429, b"{}", True), (500, b"{}", True),
         (502, b"{}", True), (503, b"{}", True), (504, b"{}", True), (0, b"", True)]


def _client(tool: str, url: str):
    if tool == "code":
        client = CodeSandboxClient(url, retries=1, timeout_s=0.2)
        client._http.timeout = httpx.Timeout(0.5)  # the client's own wait, not the snippet's limit
        return client
    client = SearchClient(url, retries=1, timeout_s=0.5)
    return client


@pytest.mark.parametrize("tool", ["code", "search"])
@pytest.mark.parametrize(("status", "body", "infrastructure"), CASES)
async def test_a_failure_is_infrastructure_exactly_when_the_service_is_at_fault(
        scripted, tool: str, status: int, body: bytes | None, infrastructure: bool) -> None:
    scripted.status, scripted.body = status, GOOD[tool] if body is None else body
    client = _client(tool, scripted.url)
    try:
        result = await client("print(6 * 7)")
    finally:
        await client.aclose()
    assert result.infrastructure is infrastructure, result
    assert result.ok is (status == 200 and body is None)
    assert (client.counts.calls, client.counts.infrastructure) == (1, int(infrastructure))


@pytest.mark.parametrize("tool", ["code", "search"])
async def test_a_refused_connection_is_infrastructure(tool: str) -> None:
    client = _client(tool, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        result = await client("print(1)")
    finally:
        await client.aclose()
    assert result.infrastructure and result.status == "unavailable" and client.counts.infrastructure == 1


# --- the outage rule, as a property ---------------------------------------------------------------------


def _trajectory(calls: list[tuple[str, bool]]) -> Trajectory:
    tool_calls = tuple(ToolCall(tool, "x", ToolResult.failure("down", "unavailable", infrastructure=True)
                                if down else ToolResult("ok", True), (0, 0), (0, 0)) for tool, down in calls)
    return Trajectory("p", (), (), (), (), tool_calls, "answer", "", 1)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.lists(st.tuples(st.sampled_from(["code", "search"]), st.booleans()), max_size=12),
                      min_size=1, max_size=5),
       step_limit=st.sampled_from([0.0, 0.25, 0.5, 1.0]), run_limit=st.sampled_from([0.0, 0.2, 1.0]))
def test_a_step_stops_exactly_when_a_service_is_past_a_limit(steps, step_limit: float, run_limit: float) -> None:
    from pipeline.types import Group, Problem, ScoredGroup
    problem = Problem("p", "q", ("a",), "math", "s", "train")
    guard = OutageGuard(step_limit, run_limit)
    run_calls: dict[str, list[bool]] = {"code": [], "search": []}
    for calls in steps:
        for tool, down in calls:
            run_calls[tool].append(down)
        step_share = {t: sum(d for tt, d in calls if tt == t) / max(1, sum(tt == t for tt, _ in calls)) for t in run_calls}
        run_share = {t: sum(v) / max(1, len(v)) for t, v in run_calls.items()}
        over = sorted({t for t in run_calls if step_share[t] > step_limit or run_share[t] > run_limit})
        groups = [ScoredGroup(Group(problem, (_trajectory(calls),)), ())]
        if over:
            with pytest.raises(ToolOutage, match=f"tool service '({'|'.join(over)})'"):
                guard.check(groups)
            return
        metrics = guard.check(groups)
        assert metrics["train/outage_dropped_groups"] == float(any(d for _, d in calls))
    assert OutageCounts.of(_trajectory(c) for c in steps).calls == guard.run.calls


# --- training with the sandbox killed mid-run -------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logs = tmp_path_factory.mktemp("sandbox-for-the-model")
    with sandbox_service(logs).start(timeout_s=120) as svc:
        return build_toy_model(tmp_path_factory.mktemp("toy") / "model", svc.url)


class KillAfter:
    """The real client; after its `n`-th call the real sandbox process group is SIGKILLed."""

    def __init__(self, client: CodeSandboxClient, service: ServiceProcess, n: int) -> None:
        self.client, self.service, self.n, self.name = client, service, n, "code"

    async def __call__(self, call_input: str) -> ToolResult:
        result = await self.client(call_input)
        self.n -= 1
        if self.n == 0:
            os.killpg(self.service.process.pid, signal.SIGKILL)
            self.service.process.wait()
        return result

    async def aclose(self) -> None:
        await self.client.aclose()


def _no_waiting(cfg):
    """The sandbox killed here is not restarted: a second's wait for it is enough."""
    return cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(update={"recover_s": 1.0})})


def _killing_tools(monkeypatch: pytest.MonkeyPatch, service: ServiceProcess, n: int) -> None:
    def tools(entries, sandbox, search, urls):
        made = make_tools(entries, sandbox, search, urls)
        return {**made, "code": KillAfter(made["code"], service, n)}
    monkeypatch.setattr(pipeline.train, "make_tools", tools)


def test_training_stops_naming_the_sandbox_killed_mid_run(tmp_path: Path, toy_model: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _no_waiting(toy_config(tmp_path, toy_model, group_size=4, steps=4, max_gen_rounds=1, checkpoints__every=1))
    with sandbox_service(tmp_path / "logs").start(timeout_s=120) as service:
        _killing_tools(monkeypatch, service, n=10)  # dies during the second step's rollout
        with pytest.raises(ToolOutage, match="tool service 'code'.*failed for infrastructure reasons"):
            pipeline.train.run(cfg, {"code": service.url}, metrics_dir=tmp_path / "metrics")
    history = (tmp_path / "metrics" / "train_history.jsonl").read_text().splitlines()
    assert len(history) == 1  # the first step trained; the second stopped before its update
    assert not Path(cfg.train.output_dir).exists()  # no final model, so nothing registered
    assert not (tmp_path / "metrics" / "train.json").exists()


def test_groups_that_read_an_outage_are_never_trained_on(tmp_path: Path, toy_model: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _no_waiting(toy_config(tmp_path, toy_model, group_size=4, prompts_per_step=4, max_gen_rounds=1,
                                 outages__max_step_share=1.0, outages__max_run_share=1.0))
    with sandbox_service(tmp_path / "logs").start(timeout_s=120) as service:
        _killing_tools(monkeypatch, service, n=6)  # some of the step's calls answer, the rest meet a dead sandbox
        tr = set_up(cfg, {"code": service.url})
        collected = collect(tr)
        metrics = outage_metrics(tr.outages, collected, 0)  # as the loop checks the step before it trains
        tr.engine.close()
    outaged = [g for g in collected.seen if any(t.infrastructure_failures for t in g.group.trajectories)]
    assert outaged, "the sandbox's death reached no trajectory"
    trained = collected.kept + collected.dropped  # the dropped are the anchoring candidates
    assert not any(t.infrastructure_failures for g in trained for t in g.group.trajectories)
    assert metrics["train/outage_dropped_groups"] == len(outaged)
    assert metrics["tool_outages/code"] == sum(t.infrastructure_failures for g in outaged
                                                         for t in g.group.trajectories)


def test_evaluation_with_a_dead_sandbox_stops_and_stores_no_sample(tmp_path: Path, toy_model: Path) -> None:
    from pipeline.evaluation.benchmarks import Benchmark
    from pipeline.evaluation.evaluate import evaluate_engine
    from pipeline.model import load_policy
    from pipeline.rollout.engine import RolloutEngine
    from tests.evaluation.conftest import make_cfg
    from tests.train.toy_task import toy_problems

    cfg = make_cfg(tmp_path / "eval", mode="tools")
    model, tokenizer = load_policy(str(toy_model), "float32", "cpu")
    dead = CodeSandboxClient(f"http://127.0.0.1:{free_port()}", retries=0)  # refused: nothing listens there
    engine = RolloutEngine(model, tokenizer, {"code": dead}, cfg.rollout, seed=0)
    bench = Benchmark("toy", "math", "toy", tuple(toy_problems(2)), 0)
    with pytest.raises(ToolOutage, match="tool service 'code'"):
        evaluate_engine(cfg, engine, [bench], model_name="toy", model_id="toy-v1")
    engine.close()
    samples = tmp_path / "eval" / "eval_samples.jsonl"
    assert not samples.exists() or not samples.read_text().strip()


def test_the_params_carry_the_outage_limits() -> None:
    cfg = load_config(REPO_ROOT / "params.yaml")
    assert 0 < cfg.train.outages.max_run_share <= cfg.train.outages.max_step_share < 1


# --- search and Redis killed --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_params(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("search")
    index_dir = tmp / "index"
    build_index(SearchConfig(corpus_path=str(shared_data / "hotpotqa_distractor_sample/"
                                             "hotpot_distractor_sample100_paragraphs.jsonl"),
                             corpus_format="jsonl", index_dir=str(index_dir)))
    (tmp / "params.yaml").write_text(yaml.safe_dump({"extends": "defaults", "search": {"index_dir": str(index_dir)}}))
    return tmp / "params.yaml"


async def test_search_killed_is_an_outage_and_redis_killed_is_not(search_params: Path, tmp_path: Path) -> None:
    redis = redis_service(tmp_path / "redis").start()
    search = python_service("search", "sandbox.search", ["--redis-url", redis.url, "--params", str(search_params)],
                            free_port(), tmp_path).start(timeout_s=120)
    client = SearchClient(search.url, retries=1)
    try:
        assert (await client("Scott Derrickson")).ok
        os.killpg(redis.process.pid, signal.SIGKILL)
        redis.process.wait()
        uncached = await client("Ed Wood director")
        assert uncached.ok and not uncached.infrastructure  # served without its cache, as it should
        os.killpg(search.process.pid, signal.SIGKILL)
        search.process.wait()
        down = await client("Ed Wood director")
        assert down.infrastructure and not down.ok and "search service unavailable" in down.output
        assert (client.counts.calls, client.counts.infrastructure) == (3, 1)
    finally:
        await client.aclose()
        search.stop()
        redis.stop()


# --- the services flow restarts what died -------------------------------------------------------------------


def test_the_services_flow_restarts_a_killed_sandbox_and_redis(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    raw["sandbox"]["workers"] = 1
    raw["search"]["url"] = "http://127.0.0.1:9"  # search itself is not started; its Redis is
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    cfg = load_config(params)
    # services this test process already runs (the session's Redis, other fixtures' sandboxes) are not the flow's
    others = {p for name in ("sandbox", "redis") for p in _service_pids(None, name)}
    with running_services(cfg, ("code", "search"), str(params), tmp_path / "logs", health_interval_s=0.1) as urls:
        first = httpx.post(f"{urls['code']}/run", json={"code": "print(6 * 7)"}, timeout=30).json()
        assert first["stdout"] == "42\n"
        for name in ("sandbox", "redis"):
            pid = _pid_on_port(urls["code"] if name == "sandbox" else None, name, others)
            os.killpg(pid, signal.SIGKILL)
            wait_for(lambda: _pid_on_port(urls["code"] if name == "sandbox" else None, name, others) not in (None, pid),
                     f"{name} to be restarted")
        again = httpx.post(f"{urls['code']}/run", json={"code": "print(6 * 7)"}, timeout=30).json()
        assert again["stdout"] == "42\n"


async def test_a_call_during_a_restart_waits_for_the_service_instead_of_failing(tmp_path: Path) -> None:
    """Recovery first: a sandbox killed under a running services flow comes back, and a call made while it
    is down is answered once it is up (the client waits out the refused connections), not an outage."""
    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    raw["sandbox"] |= {"workers": 1, "recover_s": 240.0, "deadline_s": 300.0}  # bounds on the wait, not timings
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    cfg = load_config(params)
    others = set(_service_pids(None, "sandbox"))  # other fixtures' sandboxes are not the flow's
    with running_services(cfg, ("code",), str(params), tmp_path / "logs", health_interval_s=0.1) as urls:
        client = CodeSandboxClient.from_config(cfg.sandbox, urls["code"])
        try:
            assert (await client("print(6 * 7)")).output == "42\n"
            os.killpg(_pid_on_port(urls["code"], "sandbox", others), signal.SIGKILL)
            result = await client("print(6 * 7)")
        finally:
            await client.aclose()
    assert result.ok and not result.infrastructure and result.output == "42\n", result


def _service_pids(url: str | None, name: str) -> list[int]:
    """The pids of running services `name` started by this test process (with a url: the one answering there)."""
    import psutil
    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if (name == "sandbox" and "sandbox.code" in line or name == "redis" and "redis-server" in line) and alive(proc):
            if url is None or name == "redis" or healthy(f"{url}/health"):
                pids.append(proc.pid)
    return pids


def _pid_on_port(url: str | None, name: str, others: set[int] = frozenset()) -> int | None:
    """The pid of the service `name` this test started (None while there is none): not one in `others`."""
    mine = [pid for pid in _service_pids(url, name) if pid not in others]
    return mine[0] if mine else None


def test_restarts_are_bounded_and_logged(tmp_path: Path) -> None:
    messages: list[str] = []
    service = redis_service(tmp_path / "redis").start()
    supervisor = ServiceSupervisor([service], interval_s=0.05, max_restarts=1, log=messages.append)
    with supervisor:
        for _ in range(2):
            pid = service.process.pid
            os.killpg(pid, signal.SIGKILL)
            service.process.wait()
            wait_for(lambda: service.process.pid != pid or "redis" in supervisor.given_up, "the supervisor's move")
        wait_for(lambda: "redis" in supervisor.given_up, "the supervisor to give up")
    service.stop()
    assert supervisor.restarts["redis"] == 1
    assert any("restarting it (1 of 1)" in m for m in messages)
    assert any(m.startswith("error: service redis") and "not restarted again" in m for m in messages)
