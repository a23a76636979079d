"""Search: corpora, the BM25 index, the Serper client, and the exact + guarded fuzzy Redis cache."""
