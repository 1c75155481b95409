"""vLLM's exception texts in the model's words (``contract/core/halts.py``, ``contract/core/resolve.py``).

Only the wording changes: the exception type and the facts in the message (mode, support level,
query length) are kept, so two different errors never normalise to the same text.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from contract.core.halts import (
    ADAPTIVE_PROFILE_ERROR,
    ADAPTIVE_REJECTED,
    CAPTURE_GUARD_ERROR,
    NESTED_BREAKABLE_ERROR,
    RESOLVE_REJECTED,
)
from contract.core.resolve import mamba_blocks_rejection

# vLLM's first line starts with the model's text; the rest is advice.
_EXACT_PREFIXES = {CAPTURE_GUARD_ERROR: CAPTURE_GUARD_ERROR, NESTED_BREAKABLE_ERROR.rstrip("."): NESTED_BREAKABLE_ERROR,
                   ADAPTIVE_PROFILE_ERROR: ADAPTIVE_PROFILE_ERROR}

# resolve_cudagraph_mode_and_sizes (config/compilation.py:1403-1417, :1495-1500 in 0.30.0):
# "CUDAGraphMode.FULL is not supported with SIM_ATTN backend (support: AttentionCGSupport.NEVER)..."
_NOT_SUPPORTED = re.compile(
    r"CUDAGraphMode\.(\w+) is not\s*supported with .*? backend \(\s*support:\s*(?:AttentionCGSupport\.)?(\w+)\)"
)
# adjust_cudagraph_sizes_for_spec_decode (config/compilation.py:1582-1588)
_NO_SIZES = re.compile(r"No valid cudagraph sizes after rounding to multiple of (\d+)")
# resolve's Mamba check (34:config/compilation.py:1659-1681): "max_num_seqs (4) exceeds available Mamba cache
# blocks (2). Each decode sequence requires ..."
_MAMBA_BLOCKS = re.compile(r"max_num_seqs \((\d+)\) exceeds available Mamba cache\s*blocks \((\d+)\)")
# maybe_create_adaptive_verification_manager (33:…/spec_decode/adaptive_verification.py:539-545,
# 34:…:633-639): "... query lengths vary up to 3, but SIM_ATTN_UNIFORM_BATCH allows none. Pass ..."
_VARLEN = re.compile(r"query lengths vary up to (\d+), but (?:SIM_ATTN_)?(\w+) allows (none|at most \d+)")
# _dummy_run's capture-run assertion (v1/worker/gpu_model_runner.py:5980-5986)
_MISMATCH = re.compile(r"Cudagraph runtime mode mismatch in dummy_run\. Expected (?:CUDAGraphMode\.)?(\w+)")


_PROJECT = Path(__file__).resolve().parents[2]


def raised_at(exc: BaseException) -> str | None:
    """Where in vLLM's code ``exc`` was raised: the deepest frame of its traceback in a ``vllm``
    package (the release's or a tree's), as ``vllm/path.py:LINE in FUNCTION``; None when no frame of
    vLLM's is on it (the replay's own code failed: the tool's error, not vLLM's)."""
    found = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = Path(frame.f_code.co_filename)
        if "vllm" in path.parts and not path.is_relative_to(_PROJECT / "contract"):
            rel = Path(*path.parts[len(path.parts) - 1 - path.parts[::-1].index("vllm"):])
            found = f"{rel.as_posix()}:{line} in {frame.f_code.co_name}"
    return found


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text and text[0] else type(exc).__name__


# The replay's stand-in models (contract/runners/mrv2/real/backends.py), named in vLLM's messages as
# "{type(model).__name__}: ...": which stand-in ran says nothing of vLLM's decision.
_STAND_IN_MODEL = re.compile(r"\bTiny(?:Compiled)?(?:Draft)?Model: ")


def normalise(exc: BaseException) -> str:
    """An exception raised while a wrapper, the dispatcher or the runner's steps ran."""
    line = _STAND_IN_MODEL.sub("", first_line(exc))
    for prefix, text in _EXACT_PREFIXES.items():
        if line.startswith(prefix):
            return text
    if m := _MISMATCH.search(str(exc)):
        return f"AssertionError: Cudagraph runtime mode mismatch in dummy_run: {m.group(1)}"
    return line


def resolve_rejected(exc: BaseException) -> str:
    """A ``ValueError`` of ``initialize_kv_cache``: resolve's as the model's ``ResolveRejected``,
    adaptive verification's check as the model's accepted rejection (``contract/core/halts.py``)."""
    text = str(exc)
    if m := _VARLEN.search(text):
        return f"{ADAPTIVE_REJECTED}query lengths vary up to {m.group(1)}, but a {m.group(2)} backend allows {m.group(3)}"
    if "Adaptive verification" in text:
        return f"{ADAPTIVE_REJECTED}{first_line(exc)}"
    if m := _NOT_SUPPORTED.search(text):
        return f"{RESOLVE_REJECTED}CUDAGraphMode.{m.group(1)} is not supported (support: {m.group(2)})"
    if m := _MAMBA_BLOCKS.search(text):
        return f"{RESOLVE_REJECTED}{mamba_blocks_rejection(int(m.group(1)), int(m.group(2)))}"
    if m := _NO_SIZES.search(text):
        return f"{RESOLVE_REJECTED}No valid cudagraph sizes after rounding to multiple of {m.group(1)}"
    return f"{RESOLVE_REJECTED}{first_line(exc)}"
