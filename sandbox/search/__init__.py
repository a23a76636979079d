"""The search service: FastAPI over `pipeline.search.engine.SearchEngine` (run with `python -m sandbox.search`)."""
