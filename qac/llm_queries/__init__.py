"""Queries from prompted causal language models, and filters that choose among generated queries."""
