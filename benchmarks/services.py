"""The tool services a benchmark calls, started as the pipeline starts them (`flows.services.running_services`).

A benchmark's config comes from its params file plus its overrides (`benchmarks.harness`); the services read the
same params, written to a file of its own, so a search service started here sees what the benchmark sees. A
service the params name (`sandbox.url`, `search.url`: the test tier's shared ones) is used as it is; a search
service started here serves a BM25 index of the default corpus, built under the benchmark's work folder (the
checkout's index is a DVC output a fresh clone does not have).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import derive, params_file
from flows.services import running_services
from pipeline.config import RunConfig
from pipeline.types import ToolName
from sandbox.search.build_index import build_index


@contextmanager
def tool_services(base: Path, tools: tuple[ToolName, ...], work: Path, overrides: Mapping[str, Any] | None = None
                  ) -> Iterator[tuple[RunConfig, dict[ToolName, str]]]:
    """The config (`base` with the dotted `overrides`) and {tool: URL} of `tools`, running while open."""
    settings = dict(overrides or {})
    if "search" in tools and not derive(settings, base).search.url:
        settings["search.index_dir"] = str(work / "search-index")
    params = params_file(work / "params.yaml", settings, base)
    cfg = derive(params=params)
    if "search" in tools and not cfg.search.url:
        build_index(cfg.search)
    with running_services(cfg, tools, str(params), log_dir=work / "service-logs") as urls:
        yield cfg, urls
