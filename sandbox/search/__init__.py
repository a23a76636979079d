"""The search service: FastAPI over `sandbox.search.service.SearchEngine` (run with `python -m sandbox.search`)."""
