"""Where vLLM stops, in the words the model and the replay both write, and what kind of stop it is.

The texts of the wrappers' capture paths (``compilation/monitor.py:101-110``,
``compilation/breakable_cudagraph.py:161-166`` in 0.30.0) and of adaptive verification's start-up
(``34:v1/worker/gpu/spec_decode/adaptive_verification.py:350-363,607-650``).

A stop is an **accepted rejection** when vLLM's start-up validation refuses the settings with a
``ValueError`` that says what to change: ``VllmConfig`` (``config rejected: ...``), resolve
(``resolve rejected: ...``) or ``maybe_create_adaptive_verification_manager`` (``adaptive
verification rejected: ...``). Every other stop (an ``AssertionError``, the capture guard's
``RuntimeError``, any exception after start-up validation) is a **crash**: vLLM accepted the
configuration and then could not run it (property P0). Where it raises decides its phase:
start-up (config, load, profiling, resolve, capture) or serving (``execute_model``, ``propose``).
"""

from __future__ import annotations

import enum
import re

CAPTURE_GUARD_ERROR = "RuntimeError: CUDA graph capturing detected at an inappropriate time"
NESTED_BREAKABLE_ERROR = "RuntimeError: Nested BreakableCUDAGraphCapture is not supported."
# AdaptiveVerificationManager.set_cost_curves with empty curves (33:…/adaptive_verification.py:262-268,
# 34:…:350-363): capture_model's profiling found no FULL graph to time.
ADAPTIVE_PROFILE_ERROR = "RuntimeError: Adaptive verification could not profile step costs."

CONFIG_REJECTED = "config rejected: "
RESOLVE_REJECTED = "resolve rejected: "
ADAPTIVE_REJECTED = "adaptive verification rejected: "
REJECTIONS = (CONFIG_REJECTED, RESOLVE_REJECTED, ADAPTIVE_REJECTED)

SERVING = ("execute_model", "propose")


class HaltKind(enum.Enum):
    REJECTED = "accepted rejection"
    CRASH = "crash"


def own(halted: str) -> str:
    """The stop's own text: a later PP stage's stop is said as ``PP stage s: ...``."""
    return re.sub(r"^PP stage \d+: ", "", halted)


def kind(halted: str) -> HaltKind:
    return HaltKind.REJECTED if own(halted).startswith(REJECTIONS) else HaltKind.CRASH


def phase(event_kind: str) -> str:
    """``serving`` for ``execute_model``/``propose``, ``start-up`` for every step before them."""
    return "serving" if event_kind in SERVING else "start-up"


# Why each accepted rejection is vLLM's own, documented refusal (reports list them per policy).
REASONS = {
    "config rejected: Adaptive verification requires full CUDA graphs":
        "`VllmConfig._validate_adaptive_verification` raises ValueError with advice (use a FULL mode or disable "
        "adaptive verification): 33:config/vllm.py:3153-3171, 34:config/vllm.py:3271-3289",
    RESOLVE_REJECTED + "CUDAGraphMode.":
        "`resolve_cudagraph_mode_and_sizes` raises ValueError with advice (try cudagraph_mode=PIECEWISE): FULL "
        "needs an attention backend that supports CUDA graphs at all (33:config/compilation.py:1403-1417, "
        "34:config/compilation.py:1566-1580)",
    RESOLVE_REJECTED + "max_num_seqs (":
        "`resolve_cudagraph_mode_and_sizes` raises ValueError with advice (lower max_num_seqs to the Mamba cache's "
        "blocks or raise gpu_memory_utilization): a hybrid model's FULL graphs need a Mamba cache block per "
        "request (33:config/compilation.py:1510-1532, 34:config/compilation.py:1659-1681)",
    RESOLVE_REJECTED + "No valid cudagraph sizes":
        "`adjust_cudagraph_sizes_for_spec_decode` raises ValueError with advice (adjust the capture sizes): "
        "33:config/compilation.py:1537-1565",
    ADAPTIVE_REJECTED:
        "`maybe_create_adaptive_verification_manager` raises ValueError with advice (pass "
        "enable_adaptive_verification=false or use a backend that replays varlen decode batches) before any "
        "graph is resolved: 33:v1/worker/gpu/spec_decode/adaptive_verification.py:513-545, "
        "34:…/adaptive_verification.py:607-650, called in each initialize_kv_cache (33:…/model_runner.py:703, "
        "34:…:738)",
}


def reason(halted: str) -> str:
    for prefix, why in REASONS.items():
        if own(halted).startswith(prefix):
            return why
    return "a ValueError with advice from vLLM's start-up validation"
