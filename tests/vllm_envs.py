"""The installed real-vLLM environments the evidence tests run in; skipped without them, failed
when ``CONTRACT_REQUIRE_VLLM=1``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def require(release: str) -> Path:
    """The release's venv folder."""
    venv = ROOT / f".venv-vllm-{release}"
    if not (venv / "bin" / "python").exists() or not (venv / ".complete").exists():
        message = f".venv-vllm-{release} is missing: make it with make .venv-vllm-{release}/.complete"
        if os.environ.get("CONTRACT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return venv


def run_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "ERROR", **extra}
