"""Which vLLM is installed, and which built-in policy models it.

Read from the distribution metadata, so asking does not import vLLM.
"""

from __future__ import annotations

import importlib.metadata


class EnvironmentProblem(Exception):
    """No usable vLLM for a conformance run; the message names the problem in one line."""


def installed_version() -> str:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentProblem(
            "vLLM is not installed in this Python environment; make one with "
            "conformance-env/make-env.sh VERSION .venv-vllm-VERSION, or pass --vllm VERSION"
        ) from None


def _release(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise EnvironmentProblem(f"cannot read the vLLM version {version!r}") from None


def policy_for(version: str) -> str:
    """0.29.x and earlier: ``vllm_0_29``; 0.30 to 0.33: ``vllm_0_30``; 0.34 on: no MRV1 runner."""
    release = _release(version)
    if release >= (0, 34):
        raise EnvironmentProblem(
            f"vLLM {version} has no Model Runner V1 (GPUModelRunner was removed in 0.34); "
            "the conformance replay covers 0.29 to 0.33"
        )
    if release >= (0, 30):
        return "vllm_0_30"
    return "vllm_0_29"
