"""Dataset curation: source adapters, the Calculator generator, filters, splits, multi-LLM filtering.

- `curate.run(cfg) -> CurationReport`: the stage (writes train/test/rejected/report files).
- `calculator.generate(n, seed, ...)`: TAPO's Calculator-6K, rebuilt (exact answers).
- `formats` / `adapters` / `sources`: files or hub datasets -> `Problem`s, bad rows -> `Rejection`s.
- `filters` (malformed, invalid answers, time-ambiguous rules), `dedupe` (exact, near, 13-gram).
- `judging` (multi-LLM filtering with tools), `time_judge` (optional LLM time check),
  `judge_client` (OpenAI-compatible HTTP), `judge_cache` (SQLite; nothing is paid twice).
- `python -m pipeline.data --params FILE`: run the stage from the command line.
"""
