"""Talking to a model: chat and Responses calls, streams, tokens, prices, endpoints, retries, budgets, compaction and tools."""
