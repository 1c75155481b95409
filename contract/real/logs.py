"""vLLM's logging during a conformance run: errors only, unless ``--verbose``.

Up to 0.30 vLLM configures its ``vllm`` logger when imported, from ``VLLM_LOGGING_LEVEL``
(``vllm/logger.py``). From 0.31 it no longer does: only an engine applies a logging
configuration (``configure_logging_if_needed``, ``v1/engine/llm_engine.py:68`` in 0.33.0), and the
replay starts none, so every warning reached stderr through Python's last-resort handler (over a
thousand config warnings per run, one per scenario resolve). Setting the ``vllm`` logger's level
here covers both: 0.29 and 0.30 reconfigure it at import from the same environment variable.
"""

from __future__ import annotations

import logging
import os
import sys


def configure(verbose: bool) -> None:
    """Before vLLM is imported: the ``vllm`` logger at ERROR, or at ``VLLM_LOGGING_LEVEL``
    (default INFO) with a stderr handler when ``verbose`` (stdout carries ``--json``)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() if verbose else "ERROR"
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError(f"VLLM_LOGGING_LEVEL={level} is not a logging level; use DEBUG, INFO, WARNING or ERROR")
    os.environ["VLLM_LOGGING_LEVEL"] = level
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    logger = logging.getLogger("vllm")
    logger.setLevel(level)
    if verbose and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
