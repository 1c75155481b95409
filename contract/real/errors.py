"""vLLM's exception texts in the model's words (``contract/core/halts.py``, ``contract/core/resolve.py``).

Only the wording changes: the exception type and the facts in the message (mode, support level,
query length) are kept, so two different errors never normalise to the same text.
"""

from __future__ import annotations

import re

from contract.core.halts import CAPTURE_GUARD_ERROR, NESTED_BREAKABLE_ERROR

_EXACT_PREFIXES = (CAPTURE_GUARD_ERROR, NESTED_BREAKABLE_ERROR.rstrip("."))

# resolve_cudagraph_mode_and_sizes (config/compilation.py:1403-1417, :1495-1500 in 0.30.0):
# "CUDAGraphMode.FULL is not supported with SIM_ATTN backend (support: AttentionCGSupport.NEVER)..."
_NOT_SUPPORTED = re.compile(
    r"CUDAGraphMode\.(\w+) is not\s*supported with .*? backend \(\s*support:\s*(?:AttentionCGSupport\.)?(\w+)\)"
)
# adjust_cudagraph_sizes_for_spec_decode (config/compilation.py:1582-1588)
_NO_SIZES = re.compile(r"No valid cudagraph sizes after rounding to multiple of (\d+)")
# _dummy_run's capture-run assertion (v1/worker/gpu_model_runner.py:5980-5986)
_MISMATCH = re.compile(r"Cudagraph runtime mode mismatch in dummy_run\. Expected (?:CUDAGraphMode\.)?(\w+)")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


# The replay's stand-in models (contract/runners/mrv2/real/backends.py), named in vLLM's messages as
# "{type(model).__name__}: ...": which stand-in ran says nothing of vLLM's decision.
_STAND_IN_MODEL = re.compile(r"\bTiny(?:Compiled)?(?:Draft)?Model: ")


def normalise(exc: BaseException) -> str:
    """An exception raised while a wrapper, the dispatcher or the runner's steps ran."""
    line = _STAND_IN_MODEL.sub("", first_line(exc))
    for prefix in _EXACT_PREFIXES:
        if line.startswith(prefix):
            return CAPTURE_GUARD_ERROR if prefix == CAPTURE_GUARD_ERROR else NESTED_BREAKABLE_ERROR
    if m := _MISMATCH.search(str(exc)):
        return f"AssertionError: Cudagraph runtime mode mismatch in dummy_run: {m.group(1)}"
    return line


def resolve_rejected(exc: BaseException) -> str:
    """``ValueError`` from ``resolve_cudagraph_mode_and_sizes`` as the model's ``ResolveRejected``."""
    text = str(exc)
    if m := _NOT_SUPPORTED.search(text):
        return f"resolve rejected: CUDAGraphMode.{m.group(1)} is not supported (support: {m.group(2)})"
    if m := _NO_SIZES.search(text):
        return f"resolve rejected: No valid cudagraph sizes after rounding to multiple of {m.group(1)}"
    return f"resolve rejected: {first_line(exc)}"
