"""Start the tool services (Redis, code sandbox, search), hand their URLs on, stop them on exit.

`running_services(cfg, tools)` is a context manager the other flows use; `services_flow`
runs it as a Prefect flow that keeps the services up until interrupted. A service whose
URL is set in params is used as it is, not started; on the way out every service started here is stopped at
once, in parallel, each within a bounded grace (`stop_all`). The services started here are health-checked
every `HEALTH_INTERVAL_S` while they run, and one that died is restarted on its port (at most
`MAX_RESTARTS` times each, every restart logged); one given up on stays down, and the run that
needs it stops on its outage (train.outages.max_step_share), naming it.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("services")

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from prefect import flow, get_run_logger

from flows.common import load_or_exit
from pipeline.config import RunConfig
from pipeline.data.answerable import refuse_search_that_answers_nothing
from pipeline.services.processes import (ServiceProcess, ServiceSupervisor, free_port, python_service, redis_service,
                                         stop_all)
from pipeline.types import Problem, ToolName

LOG_DIR = Path("logs/services")
HEALTH_INTERVAL_S = 1.0
MAX_RESTARTS = 3


@contextmanager
def running_services(cfg: RunConfig, tools: tuple[ToolName, ...], params_path: str = "params.yaml",
                     log_dir: Path = LOG_DIR, *, health_interval_s: float = HEALTH_INTERVAL_S,
                     max_restarts: int = MAX_RESTARTS, ranks: int = 1,
                     search_probe: Sequence[Problem] = (), stage: str = "") -> Iterator[dict[ToolName, str]]:
    """Yield {tool: base URL} for the requested tools, with everything they need running (and restarted);
    a sandbox started here is sized for `ranks` training processes calling it. The search service, started here
    or not, is first asked `search_probe` (the `stage`'s own fact questions) and refused when it shows the answer
    of none (`pipeline.data.answerable`)."""
    urls: dict[ToolName, str] = {}
    started: list[ServiceProcess] = []

    def start(service: ServiceProcess) -> str:
        started.append(service.start())  # a start that fails or is interrupted stops its own process
        return service.url

    try:
        if "code" in tools:
            urls["code"] = cfg.sandbox.url or start(python_service(
                "sandbox", "sandbox.code", cfg.sandbox.server_args(ranks), cfg.sandbox.port or free_port(), log_dir))
        if "search" in tools:
            redis_url = cfg.search.redis_url or start(redis_service(log_dir / "redis"))
            urls["search"] = cfg.search.url or start(python_service(
                "search", "sandbox.search", ["--redis-url", redis_url, "--params", params_path],
                cfg.search.port or free_port(), log_dir))
            refuse_search_that_answers_nothing(cfg.search, urls["search"], search_probe,
                                               f"the start-up probe of {stage or 'this stage'}")
        # it stops watching (and cancels a restart on the way) before the services are stopped
        with ServiceSupervisor(started, interval_s=health_interval_s, max_restarts=max_restarts):
            yield urls
    finally:
        stop_all(started)  # in parallel, each within its grace: an interrupted stage ends promptly


@flow(name="services", log_prints=True)
def services_flow(params: str = "params.yaml", tools: tuple[str, ...] = ("code", "search")) -> None:
    """Run the services until SIGINT/SIGTERM (for interactive use and notebooks). The signal stops the
    services on its way out; `python -m flows.services` then exits 130 / 143 (flows.common.stage_process)."""
    cfg = load_or_exit(params)
    with running_services(cfg, tools, params) as urls:
        get_run_logger().info("services up: %s", urls)
        threading.Event().wait()

