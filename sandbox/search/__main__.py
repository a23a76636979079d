"""`python -m sandbox.search --host 127.0.0.1 --port PORT --redis-url URL [--params PATH]`.

Starts even when Redis is down (the cache is "off" until Redis answers). The index (local-bm25) or
the API key (serper) must be there: a missing one fails start-up with a message naming it.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from pipeline.config import load_config
from pipeline.paths import REPO_ROOT
from sandbox.search.bm25 import index_vocabulary
from sandbox.search.cache import SearchCache
from sandbox.search.service import SearchService, make_provider
from sandbox.search.app import HEADER_TIMEOUT_S, create_app
from sandbox.http_limits import bounded_protocol


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.search", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", default=None, help="overrides search.redis_url from the params file")
    parser.add_argument("--params", default=str(REPO_ROOT / "params.yaml"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(args.params).search
    redis_url = args.redis_url if args.redis_url is not None else cfg.redis_url
    provider = make_provider(cfg, REPO_ROOT)  # fail fast, before the port opens
    index_dir = Path(cfg.index_dir) if Path(cfg.index_dir).is_absolute() else REPO_ROOT / cfg.index_dir
    known_words = index_vocabulary(index_dir)  # real words are never treated as typos of each other
    deadline_s = cfg.provider_timeout_s * (cfg.provider_retries + 1) + 2.0 * cfg.provider_retries

    async def make_service() -> SearchService:
        cache = SearchCache(redis_url, ttl_s=cfg.cache_ttl_s, fuzzy_threshold=cfg.fuzzy_threshold, fuzzy=cfg.fuzzy,
                            known_words=known_words)
        await cache.connect(load_in_background=True)  # healthy at once, even with a huge cache
        return SearchService(provider, cache, deadline_s=deadline_s)

    app = create_app(make_service, max_query_chars=cfg.max_query_chars, default_top_k=cfg.top_k)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=30,
                http=bounded_protocol(HEADER_TIMEOUT_S))  # request heads bounded in time and size, as the sandbox


if __name__ == "__main__":
    main()
