"""Dataset curation: source adapters, the Calculator generator, filters, splits, multi-LLM filtering."""
