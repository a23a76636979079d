"""Benchmark evaluation: which model, which benchmarks, which mode, how many samples, the judge.

With `benchmarks` empty the stage evaluates `split_file` (the curated test split), grouped
by each problem's source; that is the offline default. Each benchmark names a known data set
(its file under the shared data directory, adapter, problem type and Table-1 category come
from `pipeline.evaluation.benchmarks`) or a custom one with `adapter` and `type` given.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig
from pipeline.config.curate import AdapterName, FileFormat, ProblemTypeName

Category = Literal["fact", "math", "comprehensive"]
# Benchmark names the evaluation knows by default (their files, adapters and types live in
# pipeline.evaluation.benchmarks; the config only needs the names to reject typos at load time).
KNOWN_BENCHMARKS: tuple[str, ...] = (
    "gsm8k", "math500", "math", "aime24", "aime25", "amc23", "olympiadbench", "minerva_math", "deepmath",
    "nq", "nq_open", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle",
    "calculator", "complex",
)


class BenchmarkConfig(StageConfig):
    """One benchmark: a known name (defaults filled in) or a custom file/hub id with adapter and type."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Benchmark label (Problem.source, table column, reward routing).")
    path: str = Field("", description="Local file; empty = the known benchmark's file under the shared data directory.")
    hub_id: str = Field("", description="Hugging Face dataset id read with `datasets` (needs network); used instead of path.")
    hub_config: str = Field("", description="Hub dataset configuration name (empty = default).")
    hub_split: str = Field("test", min_length=1, description="Hub split to read.")
    format: FileFormat = Field("auto", description="File format; auto = from the file extension.")
    adapter: AdapterName | Literal["problems", ""] = Field("", description="Row mapping ('problems' = curated Problem JSONL); empty = the known benchmark's.")
    type: ProblemTypeName | Literal[""] = Field("", description="Problem type (verifier and tools offered); empty = the known benchmark's.")
    category: Category | Literal[""] = Field("", description="Table-1 column group; empty = the known benchmark's (custom: from type).")
    limit: int = Field(0, ge=0, description="Evaluate at most this many problems of this benchmark (0 = evaluate.limit).")

    @model_validator(mode="after")
    def _known_or_complete(self) -> BenchmarkConfig:
        if self.path and self.hub_id:
            raise ValueError(f"benchmark {self.name!r}: set at most one of path or hub_id")
        if self.name not in KNOWN_BENCHMARKS and not (self.adapter and self.type and (self.path or self.hub_id)):
            raise ValueError(f"unknown benchmark {self.name!r}: known are {list(KNOWN_BENCHMARKS)}; "
                             "a custom benchmark needs path (or hub_id), adapter and type")
        return self


class EvalJudgeConfig(StageConfig):
    """An OpenAI-compatible LLM judge for answers the rule-based verifier rejects (ARPO/TEPO style)."""

    enabled: bool = Field(False, description="Ask the judge about rule-rejected answers of the kinds below.")
    base_url: str = Field("", description="Endpoint root, e.g. https://api.openai.com/v1 (required when enabled).")
    model: str = Field("", description="Judge model name (required when enabled).")
    api_key_env: str = Field("", description="Environment variable holding the API key (empty = no key).")
    kinds: tuple[Literal["fact", "math", "calculator", "complex", "em", "f1"], ...] = Field(("fact",), min_length=1, description="Verifier kinds whose answers the judge may accept.")
    concurrency: int = Field(8, ge=1, le=256, description="Judge requests in flight at once.")
    timeout_s: float = Field(60.0, gt=0.0, description="Per-request timeout.")
    max_retries: int = Field(3, ge=0, description="Retries of a failed request (429, 5xx, network).")
    backoff_s: float = Field(1.0, ge=0.0, description="First retry delay; doubles each retry.")
    cache_path: str = Field(".cache/evaluate/judge.sqlite", min_length=1, description="Persistent cache of verdicts, so a re-run never asks twice.")

    @model_validator(mode="after")
    def _endpoint_when_enabled(self) -> EvalJudgeConfig:
        if self.enabled and not (self.base_url and self.model):
            raise ValueError("judge.enabled needs judge.base_url and judge.model")
        return self


class BaselineConfig(StageConfig):
    """A model the policy is compared with on the same problems (the DVC stage evaluate-<name> evaluates it)."""

    model: str = Field(..., min_length=1, description="The model: a directory, an embedded model name, a hub id or an MLflow URI.")
    label: str = Field("", description="Its row in the comparison table (empty = model name and mode).")
    output_dir: str = Field(..., min_length=1, description="Where its evaluation goes (the stage's output).")


class EvaluateConfig(StageConfig):
    model: str = Field("models/policy", min_length=1, description="Model to evaluate: a directory, an embedded model name, a hub id or an MLflow model URI (models:/, runs:/).")
    split_file: str = Field("data/curated/test.jsonl", min_length=1, description="Problems evaluated when `benchmarks` is empty (curated Problem JSONL).")
    limit: int = Field(24, ge=0, description="Evaluate at most this many problems per benchmark (0 = all).")
    samples: int = Field(1, ge=1, description="Samples per problem (1 with temperature 0 = greedy pass@1).")
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 = greedy decoding.")
    output_dir: str = Field("metrics", min_length=1, description="Where eval.json, eval_samples.jsonl, eval_table.md and eval_plots/ go.")
    label: str = Field("", description=(
        "Row name in the comparison table (empty = what trained the model, e.g. 'SFT + DAPO (tools)', for the train "
        "stage's output; else its folder's name; then the mode)."))
    mode: Literal["tools", "no_tools"] = Field("tools", description="tools = TAPO's '+ SE/CI' prompting with services; no_tools = plain reasoning.")
    benchmarks: tuple[BenchmarkConfig, ...] = Field((), description="Benchmarks to evaluate (empty = split_file).")
    pass_k: tuple[int, ...] = Field((1,), min_length=1, description="k values of unbiased pass@k (each <= samples).")
    chunk_problems: int = Field(16, ge=1, description="Problems per rollout batch; finished batches are saved, so a crash loses at most one.")
    resume: bool = Field(True, description="Keep finished samples of the same model and settings from an interrupted run.")
    baselines: dict[str, BaselineConfig] = Field(default_factory=dict, description=(
        "Models the policy's evaluation is compared with, each evaluated on the same problems by its own stage "
        "(`python -m flows.evaluate --baseline <name>`); the policy's stage puts them first in its report."))
    compare_dirs: tuple[str, ...] = Field((), description="Output dirs of earlier evaluations to put beside this one in the table and plots.")
    plots: bool = Field(True, description="Write PNG plots (tool calls, accuracy vs search calls, response lengths).")
    judge: EvalJudgeConfig = Field(default_factory=EvalJudgeConfig, description="Optional LLM judge for fact answers.")

    @model_validator(mode="after")
    def _consistent(self) -> EvaluateConfig:
        names = [b.name for b in self.benchmarks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"benchmark names must be unique, repeated: {dupes}")
        too_big = [k for k in self.pass_k if not 1 <= k <= self.samples]
        if too_big:
            raise ValueError(f"pass_k values {too_big} must be between 1 and samples={self.samples}")
        bad = [n for n in self.baselines if not re.fullmatch(r"[A-Za-z0-9_-]+", n)]
        if bad:
            raise ValueError(f"baseline names {bad} must be letters, digits, '_' or '-' (each names a DVC stage "
                             "evaluate-<name>)")
        return self
