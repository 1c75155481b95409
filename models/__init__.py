"""Tiny torch models the conformance replay runs vLLM's wrappers around (``models.tiny``)."""
