"""The search service: FastAPI over `sandbox.search.service.SearchService` (run with `python -m sandbox.search`)."""
