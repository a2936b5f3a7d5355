"""Benchmarks: threadkeep next to LangGraph's own savers, in the same process (``./dev bench``)."""
