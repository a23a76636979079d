"""Dataset curation: sources, the Calculator generator, filters, splits and multi-LLM filtering."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig

AdapterName = Literal[
    "gsm8k", "math", "aime", "amc", "olympiadbench", "deepmath",
    "nq_open", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "verl",
]
FileFormat = Literal["auto", "jsonl", "json", "csv", "parquet"]
ProblemTypeName = Literal["math", "fact", "calculator", "complex", "multihop", "code"]


class CalculatorConfig(StageConfig):
    n_train: int = Field(240, ge=0, description="Generated calculator problems for training.")
    n_test: int = Field(60, ge=0, description="Generated calculator problems for testing.")
    levels: tuple[Literal[1, 2, 3], ...] = Field((1, 2, 3), min_length=1, description="Difficulty levels drawn uniformly (1 = small operands).")


class WikiFactsConfig(StageConfig):
    """Fact questions generated from the embedded Wikipedia dump (`pipeline.data.wiki_facts`): the offline fact set."""

    enabled: bool = Field(False, description="Generate them (params.yaml: on, the main job's fact questions; no download).")
    test_fraction: float = Field(0.4, ge=0.0, le=1.0, description="Share of the dump's pages whose questions go to test (split by page).")
    answerable_only: bool = Field(True, description=(
        "Keep a question only when searching it with the search service shows a gold answer within "
        "rollout.max_tool_output_chars (filter unanswerable); the curate stage then starts the search service."))


class SourceConfig(StageConfig):
    """One input data set: a local file or a hub id, mapped to `Problem`s by a named adapter."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Source label written to Problem.source and used in ids.")
    path: str = Field("", description="Local file (JSONL, JSON, CSV or parquet); relative paths are from the working directory.")
    hub_id: str = Field("", description="Hugging Face dataset id, read with `datasets` (needs network); used when path is empty.")
    hub_config: str = Field("", description="Hub dataset configuration name (empty = default).")
    hub_split: str = Field("test", min_length=1, description="Hub split to read.")
    format: FileFormat = Field("auto", description="File format; auto = from the file extension.")
    adapter: AdapterName = Field(..., description="Row mapping to Problem (field names and answer extraction).")
    type: ProblemTypeName = Field(..., description="Problem.type: selects the verifier and the tools offered.")
    split: Literal["train", "test", "holdout"] = Field(..., description="train, test, or holdout = seeded split by test_fraction.")
    limit: int = Field(0, ge=0, description="Read at most this many rows (0 = all).")
    judge: bool = Field(False, description="Keep rows only if the multi-LLM judges answer them (TAPO-hard).")
    answerable_only: bool = Field(False, description=(
        "Keep a row only when searching its question shows a gold answer within rollout.max_tool_output_chars "
        "(filter unanswerable; the curate stage then starts the search service)."))

    @model_validator(mode="after")
    def _one_location(self) -> SourceConfig:
        if bool(self.path) == bool(self.hub_id):
            raise ValueError(f"source {self.name!r}: set exactly one of path or hub_id")
        return self


class FilterConfig(StageConfig):
    time_ambiguous: bool = Field(True, description="Drop time-ambiguous questions ('this year', 'current', ...) without an explicit date.")
    time_ambiguous_types: tuple[ProblemTypeName, ...] = Field(("fact", "multihop"), description="Problem types the time rule applies to.")
    time_judge: str = Field("", description="Name of a multi_llm judge also asked whether each such question is time-ambiguous (empty = rules only).")
    exact_duplicates: bool = Field(True, description="Drop rows whose normalised question was already kept.")
    near_duplicate_threshold: float = Field(0.9, ge=0.0, le=1.0, description="Word-3-gram Jaccard at or above which a row is a near duplicate (0 = off).")
    near_duplicate_types: tuple[ProblemTypeName, ...] = Field(("math", "fact", "multihop", "complex"), description="Types checked for near duplicates (templates make calculator rows look alike).")
    contamination_ngram: int = Field(13, ge=0, description="Drop training rows sharing an n-gram with any test row (0 = off).")
    max_question_chars: int = Field(4000, ge=1, description="Longer questions are rejected as malformed.")
    max_answer_chars: int = Field(300, ge=1, description="Longer answers are rejected as malformed.")
    max_answers: int = Field(100, ge=1, description="Rows with more aliases are rejected as malformed.")


class JudgeConfig(StageConfig):
    """One judge: an OpenAI-compatible chat-completions endpoint with function calling."""

    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Label in the report and the cache key.")
    base_url: str = Field(..., min_length=1, description="Endpoint root, e.g. https://api.openai.com/v1.")
    model: str = Field(..., min_length=1, description="Model name sent in each request.")
    api_key_env: str = Field("", description="Environment variable holding the API key (empty = no key).")
    input_usd_per_mtok: float = Field(0.0, ge=0.0, description="Price of a million prompt tokens, for cost accounting.")
    output_usd_per_mtok: float = Field(0.0, ge=0.0, description="Price of a million completion tokens.")


class MultiLLMConfig(StageConfig):
    judges: tuple[JudgeConfig, ...] = Field((), description="Judges asked about rows of sources with judge: true (empty = stage off).")
    min_correct: int = Field(0, ge=0, description="Keep a row when this many judges are right (0 = all of them).")
    concurrency: int = Field(8, ge=1, le=1024, description="Judge requests in flight at once.")
    max_retries: int = Field(4, ge=0, description="Retries of a failed request (429, 5xx, network), with exponential backoff.")
    backoff_s: float = Field(1.0, ge=0.0, description="First retry delay; doubles each retry.")
    timeout_s: float = Field(120.0, gt=0.0, description=(
        "Per-request read timeout: the longest the judge may stay silent (a long completion is sent whole)."))
    connect_timeout_s: float = Field(10.0, gt=0.0, description="Per-request connection timeout.")
    deadline_s: float = Field(300.0, gt=0.0, description=(
        "Most time one judge call may take, its retries and back-off included; past it the judge counts as unreachable "
        "and the stage fails (the first unreachable call stops the others, so a hanging judge costs one deadline)."))
    max_tool_turns: int = Field(4, ge=0, description="Tool calls a judge may make before it must answer.")
    max_tokens: int = Field(2048, ge=1, description="Completion tokens per request.")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="Sampling temperature of the judges.")
    correct_threshold: float = Field(0.9, ge=0.0, le=1.0, description="A verifier score at or above this counts as correct.")
    code_url: str = Field("", description="Code sandbox service the judges' code tool calls (empty = no code tool).")
    search_url: str = Field("", description="Search service the judges' search tool calls (empty = no search tool).")
    cache_path: str = Field(".cache/curate/judges.sqlite", min_length=1, description="Persistent cache of judge answers; kept across runs so nothing is paid twice.")

    @model_validator(mode="after")
    def _k_of_n(self) -> MultiLLMConfig:
        if self.min_correct > len(self.judges):
            raise ValueError(f"min_correct={self.min_correct} exceeds the {len(self.judges)} judges")
        names = [j.name for j in self.judges]
        if len(set(names)) != len(names):
            raise ValueError(f"judge names must be unique, got {names}")
        return self


class CurateConfig(StageConfig):
    seed: int = Field(0, ge=0, description="Seed of generation and splitting.")
    calculator: CalculatorConfig = Field(default_factory=CalculatorConfig, description="TAPO Calculator-6K generator.")
    wiki_facts: WikiFactsConfig = Field(default_factory=WikiFactsConfig, description="Fact questions from the embedded Wikipedia dump.")
    offer_all_tools: bool = Field(False, description=(
        "Every problem offers both tools (type complex), so the policy must choose one; the source still routes "
        "the verifier (reward.routing). False keeps each type's own tool (TAPO's routing); params.yaml: on."))
    sources: tuple[SourceConfig, ...] = Field((), description="Input data sets, in priority order (earlier wins a duplicate).")
    test_fraction: float = Field(0.1, ge=0.0, le=1.0, description="Share of a holdout source's rows that go to test.")
    filters: FilterConfig = Field(default_factory=FilterConfig, description="Rule-based filters.")
    multi_llm: MultiLLMConfig = Field(default_factory=MultiLLMConfig, description="TAPO-hard multi-LLM filtering.")
    output_dir: str = Field("data/curated", min_length=1, description="One JSONL file per split, rejected.jsonl and report.json.")
    max_rejected_share: float = Field(0.9, gt=0.0, le=1.0, description=(
        "The stage fails (naming the source, the filter and what decides it: the search service, a judge, the "
        "tokenizer) when one filter rejects all of a source's rows or more than this share of them, instead of "
        "writing a degenerate set; 1.0: only a whole source (pipeline.data.broken)."))

    @model_validator(mode="after")
    def _unique_sources(self) -> CurateConfig:
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique, repeated: {dupes}")
        reserved = sorted({"calculator", "wiki_facts"} & set(names))
        if reserved:
            raise ValueError(f"source names {reserved} are reserved for the generators")
        judge_names = [j.name for j in self.multi_llm.judges]
        if self.filters.time_judge and self.filters.time_judge not in judge_names:
            raise ValueError(f"filters.time_judge {self.filters.time_judge!r} is not one of multi_llm.judges {judge_names}")
        judged = [s.name for s in self.sources if s.judge]
        if judged and not self.multi_llm.judges:
            raise ValueError(f"sources {judged} have judge: true but multi_llm.judges is empty")
        return self

    def needs_search(self) -> bool:
        """Whether the unanswerable filter runs (and so the curate stage needs the search service)."""
        return (self.wiki_facts.enabled and self.wiki_facts.answerable_only) or any(s.answerable_only for s in self.sources)
