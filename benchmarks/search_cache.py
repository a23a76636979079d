"""Search cache and BM25 benchmark: ours vs TAPO's difflib scan and rapidfuzz extractOne, in one run.

    python benchmarks/search_cache.py [--difflib-queries-10k 3] [--difflib-queries-100k 1] [--sizes 10000,100000,1000000]
                                      [--quick]

Measures
1. exact-hit latency through HTTP (service subprocess + private Redis, keep-alive client): p50/p99;
2. fuzzy lookup time at 10k / 100k / 1M cached queries: our candidate index (`FuzzyIndex.lookup`)
   vs TAPO's linear difflib scan (ratio >= 0.9; only at the sizes where it finishes in seconds) and vs
   rapidfuzz `process.extractOne(fuzz.ratio, score_cutoff=90)` over all keys; at 10k and 100k also the
   full Redis-backed `SearchCache.get` (two Redis round trips + the index) and the index reload time;
   at 1M the index is built in-process (loading 1M keys into a private Redis would add minutes of
   set-up and measure Redis, not the lookup; the Redis part of a fuzzy hit is two GETs at any size);
3. guard set: false merges (near misses) and true merges (variants), ours vs the difflib rule;
4. BM25 queries/s (bm25s, one query at a time, top-3) on the default corpus and the KILT sample.

Cached queries are real questions from the shared QA sets (~40k) topped up with synthetic ones made by
swapping one or two words of a real question for corpus words (and sometimes a year), so common
question words ("who", "what", "the") are as frequent as in real traffic. Lookup queries are half
variants of cached keys (a typo, an article dropped) and half real questions not in the cache.
Last line: one JSON object; "ratio" = difflib time / our time at 100k (higher is better).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis.asyncio as aioredis
import yaml
from rapidfuzz import fuzz, process

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness  # noqa: E402
from pipeline.config.search import SearchConfig  # noqa: E402
from pipeline.paths import shared_data_dir  # noqa: E402
from sandbox.search.bm25 import BM25Index, index_vocabulary  # noqa: E402
from sandbox.search.build_index import build_index  # noqa: E402
from sandbox.search.cache import SearchCache  # noqa: E402
from sandbox.search.corpus import load_corpus  # noqa: E402
from sandbox.search.fuzzy import FuzzyIndex  # noqa: E402
from sandbox.search.normalize import normalize_query  # noqa: E402
from sandbox.search.results import Passage  # noqa: E402
from pipeline.services.processes import free_port, python_service, redis_service  # noqa: E402

QUESTION_FILES = [
    ("nq_open/NQ-open.dev.jsonl", "jsonl"), ("triviaqa/test.jsonl", "jsonl"), ("popqa/test.jsonl", "jsonl"),
    ("r1searcher_train/stage_2.jsonl", "jsonl"), ("hotpotqa/dev.json", "json"),
    ("2wikimultihopqa/2wikimultihop_test_questions_and_answers.json", "json"),
    ("musique/musique_test_questions_and_answers.json", "json"),
]
RESULTS = (Passage(id="1", title="T", text="cached passage text", score=1.0),)
QUICK = {"sizes": "10000", "queries": 10, "difflib_queries_10k": 1, "http_requests": 20}


def real_questions(data: Path) -> list[str]:
    questions: list[str] = []
    for name, kind in QUESTION_FILES:
        text = (data / name).read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()] if kind == "jsonl" else json.loads(text)
        questions.extend(normalize_query(row["question"]) for row in rows)
    return sorted(set(q for q in questions if q))


def synthetic_keys(real: list[str], vocabulary: list[str], n: int, rng: random.Random) -> list[str]:
    keys = set(real)
    while len(keys) < n:
        words = rng.choice(real).split()
        for _ in range(rng.choice((1, 2))):
            words[rng.randrange(len(words))] = rng.choice(vocabulary)
        if rng.random() < 0.2:
            words.append(str(rng.randrange(1800, 2030)))
        keys.add(" ".join(words))
    return sorted(keys)[:n] if len(keys) > n else sorted(keys)


def lookup_queries(keys: list[str], fresh: list[str], n: int, rng: random.Random) -> list[str]:
    queries = []
    for i in range(n):
        if i % 2:
            queries.append(rng.choice(fresh))
            continue
        words = rng.choice(keys).split()
        long_words = [j for j, w in enumerate(words) if len(w) >= 6]
        if long_words:
            j = rng.choice(long_words)
            k = rng.randrange(1, len(words[j]))
            words[j] = words[j][:k] + words[j][k + 1:]
        else:
            words = [w for w in words if w != "the"]
        queries.append(" ".join(words))
    return queries


def difflib_scan(query: str, keys: list[str]) -> str | None:
    """TAPO's rule over every key: best difflib ratio >= 0.9."""
    best, best_ratio = None, 0.9
    for key in keys:
        ratio = difflib.SequenceMatcher(None, query, key).ratio()
        if ratio >= best_ratio:
            best, best_ratio = key, ratio
    return best


def timed_ms(fn, queries: list[str]) -> list[float]:
    out = []
    for q in queries:
        t = time.perf_counter()
        fn(q)
        out.append((time.perf_counter() - t) * 1000.0)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_fuzzy_size(keys: list[str], queries: list[str], difflib_n: int, known: frozenset[str]) -> dict:
    started = time.perf_counter()
    index = FuzzyIndex(0.9, known_words=known)
    for key in keys:
        index.add(key)
    build_s = time.perf_counter() - started
    ours = timed_ms(index.lookup, queries)
    rf_queries = queries[: max(10, min(len(queries), 2_000_000 // len(keys)))]
    rapid = timed_ms(lambda q: process.extractOne(q, keys, scorer=fuzz.ratio, score_cutoff=90), rf_queries)
    row = {"n": len(keys), "index_build_s": round(build_s, 2), "ours_p50_ms": round(pct(ours, 0.5), 4),
           "ours_p99_ms": round(pct(ours, 0.99), 3), "ours_hits": sum(index.lookup(q) is not None for q in queries),
           "rapidfuzz_p50_ms": round(pct(rapid, 0.5), 3), "rapidfuzz_queries": len(rf_queries)}
    if difflib_n:
        slow = timed_ms(lambda q: difflib_scan(q, keys), queries[:difflib_n])
        row.update(difflib_p50_ms=round(pct(slow, 0.5), 1), difflib_queries=difflib_n)
    print(json.dumps(row), flush=True)
    return row


async def bench_redis_cache(redis_url: str, keys: list[str], queries: list[str], known: frozenset[str]) -> dict:
    namespace = f"bench:{len(keys)}"
    fresh = SearchCache(redis_url, ttl_s=3600, fuzzy_threshold=0.9, namespace=namespace, known_words=known)
    loader = aioredis.from_url(redis_url, socket_timeout=60, decode_responses=True)
    for start in range(0, len(keys), 5000):
        async with loader.pipeline(transaction=False) as pipe:  # bulk load, same layout as put()
            for key in keys[start:start + 5000]:
                payload = json.dumps({"query": key, "results": [RESULTS[0].to_dict()]})
                pipe.set(fresh._result_key("local-bm25", 3, key), payload, ex=3600)
                pipe.zadd(fresh._index_key("local-bm25", 3), {key: time.time() + 3600})
            await pipe.execute()
    started = time.perf_counter()
    await fresh.connect()
    reload_s = time.perf_counter() - started
    times = []
    for q in queries:
        t = time.perf_counter()
        await fresh.get("local-bm25", 3, q)
        times.append((time.perf_counter() - t) * 1000.0)
    c = fresh.counters
    assert c.off == 0, "Redis went away during the benchmark"
    await loader.aclose()
    await fresh.aclose()
    row = {"n": len(keys), "reload_s": round(reload_s, 2), "cache_get_p50_ms": round(pct(times, 0.5), 3),
           "cache_get_p99_ms": round(pct(times, 0.99), 3), "fuzzy_hits": c.fuzzy_hits, "misses": c.misses}
    print(json.dumps(row), flush=True)
    return row


def bench_http_exact(index_dir: Path, redis_url: str, tmp: Path, n: int) -> dict:
    params = tmp / "params.yaml"
    params.write_text(yaml.safe_dump({"extends": "defaults", "search": {"index_dir": str(index_dir)}}))
    with python_service("search", "sandbox.search", ["--redis-url", redis_url, "--params", str(params)],
                        free_port(), tmp) as service, httpx.Client(base_url=service.url) as client:
        queries = ["what is albedo", "who founded anarchism", "history of the alphabet", "what is an algorithm"]
        for q in queries:
            client.post("/search", json={"query": q})
        times, server = [], []
        for i in range(n):
            t = time.perf_counter()
            body = client.post("/search", json={"query": queries[i % len(queries)]}).json()
            times.append((time.perf_counter() - t) * 1000.0)
            server.append(body["duration_ms"])
            assert body["cache"] == "exact"
    row = {"http_exact_p50_ms": round(pct(times, 0.5), 3), "http_exact_p99_ms": round(pct(times, 0.99), 3),
           "server_exact_p50_ms": round(pct(server, 0.5), 3), "http_requests": n}
    print(json.dumps(row), flush=True)
    return row


def bench_bm25(index: BM25Index, questions: list[str]) -> float:
    started = time.perf_counter()
    for q in questions:
        index.search(q, 3)
    return len(questions) / (time.perf_counter() - started)


def guard_set_figures(known: frozenset[str]) -> dict:
    data = Path(__file__).resolve().parent.parent / "tests" / "search" / "data"
    out = {}
    for name, label in (("near_misses.tsv", "near_miss"), ("true_variants.tsv", "true_variant")):
        pairs = [line.split("\t") for line in (data / name).read_text().splitlines() if line and not line.startswith("#")]
        ours = 0
        for query, cached in pairs:
            index = FuzzyIndex(0.9, known_words=known)
            index.add(normalize_query(cached))
            ours += normalize_query(query) == normalize_query(cached) or index.lookup(normalize_query(query)) is not None
        tapo = sum(difflib.SequenceMatcher(None, q.lower(), c.lower()).ratio() >= 0.9 for q, c in pairs)
        out.update({f"{label}_pairs": len(pairs), f"{label}_merged_ours": ours, f"{label}_merged_difflib": tapo})
    return out


def fuzzy_figures(redis_url: str, keys_all: list[str], fresh: list[str], sizes: list[int], args: argparse.Namespace,
                  known: frozenset[str], rng: random.Random) -> dict:
    figures: dict = {}
    for size in sizes:
        keys = keys_all[:size]
        queries = lookup_queries(keys, fresh, args.queries, rng)
        difflib_n = {10_000: args.difflib_queries_10k, 100_000: args.difflib_queries_100k}.get(size, 0)
        row = bench_fuzzy_size(keys, queries, difflib_n, known)
        tag = f"{size // 1000}k" if size < 1_000_000 else f"{size // 1_000_000}m"
        figures.update({f"fuzzy_{k}_{tag}": v for k, v in row.items() if k != "n"})
        figures[f"ratio_vs_rapidfuzz_{tag}"] = round(row["rapidfuzz_p50_ms"] / row["ours_p50_ms"], 1)
        if "difflib_p50_ms" in row:
            figures[f"ratio_vs_difflib_{tag}"] = round(row["difflib_p50_ms"] / row["ours_p50_ms"], 1)
        if size <= 100_000:
            redis_row = asyncio.run(bench_redis_cache(redis_url, keys, queries, known))
            figures.update({f"redis_{k}_{tag}": v for k, v in redis_row.items() if k != "n"})
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--difflib-queries-10k", type=int, default=3)
    parser.add_argument("--difflib-queries-100k", type=int, default=1)
    parser.add_argument("--http-requests", type=int, default=2000)
    parser.add_argument("--parts", default="http,fuzzy,bm25", help="comma-separated subset to run")
    args = harness.parse(parser, argv, QUICK)
    parts = set(args.parts.split(","))
    rng = random.Random(0)
    data = shared_data_dir()
    tmp = Path(tempfile.mkdtemp(prefix="search-bench-"))
    index_dir = tmp / "default-index"
    build_s = build_index(SearchConfig(index_dir=str(index_dir))).seconds
    known = index_vocabulary(index_dir)
    figures: dict = {"default_index_build_s": round(build_s, 2), **guard_set_figures(known)}
    questions = real_questions(data)
    rng.shuffle(questions)
    fresh, real = questions[:2000], questions[2000:]
    with redis_service(tmp / "redis") as redis:
        if "http" in parts:
            figures.update(bench_http_exact(index_dir, redis.url, tmp, args.http_requests))
        if "fuzzy" in parts:
            sizes = [int(s) for s in args.sizes.split(",")]
            keys = synthetic_keys(real, sorted(known), max(sizes), rng)
            rng.shuffle(keys)
            figures.update(fuzzy_figures(redis.url, keys, fresh, sizes, args, known, rng))
    if "bm25" in parts:
        figures.update(bm25_figures(data, index_dir, fresh[:300]))
    figures["ratio"] = figures.get("ratio_vs_difflib_100k", figures.get("ratio_vs_difflib_10k"))
    harness.last_line(figures, args.quick)


def bm25_figures(data: Path, index_dir: Path, questions: list[str]) -> dict:
    kilt = BM25Index.build(load_corpus(data / "wiki_corpus_samples/filtered_kilt_sample_100.jsonl", "kilt"))
    default = BM25Index.load(index_dir)
    return {"bm25_qps_default": round(bench_bm25(default, questions), 1), "bm25_passages_default": len(default.passages),
            "bm25_qps_kilt": round(bench_bm25(kilt, questions), 1), "bm25_passages_kilt": len(kilt.passages)}


if __name__ == "__main__":
    main()
