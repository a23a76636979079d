"""Tool services that run beside the rollout: the code interpreter and the search engine."""
