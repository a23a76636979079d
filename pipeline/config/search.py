"""The search service, its providers and its Redis cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig


class SearchConfig(StageConfig):
    url: str = Field("", description="Use an already running search service at this URL; empty = the services flow starts one.")
    port: int = Field(0, ge=0, le=65535, description="Port for a started search service (0 = any free port).")
    provider: Literal["local-bm25", "serper"] = Field("local-bm25", description="Where results come from.")
    redis_url: str = Field("", description="Redis for the cache; empty = the services flow starts a private one.")
    top_k: int = Field(3, ge=1, le=50, description="Results per query.")
    corpus_path: str = Field("", description="Corpus for the local BM25 index; empty = the Wikipedia dump excerpt in the gensim wheel.")
    corpus_format: Literal["wikidump", "jsonl", "kilt", "wiki18"] = Field(
        "wikidump", description="Format of corpus_path: MediaWiki XML dump, {id,title,text} JSONL, KILT pages, or wiki-18 JSONL.")
    passage_words: int = Field(100, ge=10, le=2000, description="Long texts are cut into passages of about this many words.")
    index_dir: str = Field("data/search/index", description="Where the build-index stage writes the BM25 index and the service reads it.")
    cache_ttl_s: int = Field(604800, ge=1, description="Seconds a cached result lives in Redis (TAPO: 7 days).")
    fuzzy: bool = Field(False, description=(
        "Also serve guarded fuzzy cache hits (TAPO's cache; saves paid API calls). A fuzzy hit answers with a similar "
        "query's cached results, so answers then depend on which similar query came first: not reproducible."))
    fuzzy_threshold: float = Field(0.9, ge=0.5, le=1.0, description="Minimum Indel similarity (difflib-style ratio) of a fuzzy hit.")
    max_query_chars: int = Field(512, ge=8, le=10000, description="Longer queries are refused with HTTP 413.")
    provider_timeout_s: float = Field(10.0, gt=0, le=300, description="Timeout of one provider call.")
    provider_retries: int = Field(2, ge=0, le=10, description="Retries of a failed provider call before answering 502/503.")
    recover_s: float = Field(20.0, ge=0.0, le=600.0, description=(
        "Client: keep retrying a refused connection this long (a search service the services flow is restarting) "
        "before the call counts as an outage; 0 = no waiting."))
    deadline_s: float = Field(60.0, gt=0.0, le=3600.0, description=(
        "Client: the deadline of a whole call (retries and the wait for a restarting service included); no complete "
        "answer by then is an outage. At least provider_timeout_s x (provider_retries + 1) + recover_s."))
    max_answer_bytes: int = Field(1 << 20, ge=1024, le=1 << 30, description=(
        "Client: an answer longer than this is not read; the call is answered 'too_large' (not an outage)."))
    serper_url: str = Field("https://google.serper.dev/search", description="Serper search endpoint.")
    serper_api_key_env: str = Field("SERPER_API_KEY", description="Environment variable that holds the Serper API key.")
    serper_rate_per_s: float = Field(5.0, gt=0, le=1000, description="Maximum Serper requests per second from one service.")

    @model_validator(mode="after")
    def _deadline_holds_a_call(self) -> SearchConfig:
        needed = self.provider_timeout_s * (self.provider_retries + 1) + self.recover_s
        if self.deadline_s < needed:
            raise ValueError(f"search.deadline_s ({self.deadline_s:g}) must be at least search.provider_timeout_s x "
                             f"(search.provider_retries + 1) + search.recover_s ({needed:g}): the service may try its "
                             "provider that long after the client waited out a restart")
        return self
