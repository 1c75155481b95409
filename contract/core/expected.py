"""The expected verdict table of the built-in policies: verdicts are data, checked by the tests.

``FAILS`` lists, per policy, the properties it is expected to violate. Every other property is
expected to hold.
"""

from __future__ import annotations

FAILS: dict[str, frozenset[str]] = {
    # FULL dispatches captured by the match-any breakable wrapper (P3); drafter PIECEWISE under a
    # FULL target captured at runtime with the capture guard off: P4, and vLLM stops when serving
    # (P0); PIECEWISE with no capturer under micro-batching or after a late upgrade (P1).
    # Every MRV1 revision micro-batching on several DP ranks under cudagraph_mode FULL: UBatchWrapper
    # captures a mixed step's micro-batches when serving, with no capture flag to stop it (P4), and
    # replays that graph for the next mixed step of its count, split at other requests (P7).
    # Every MRV1 revision with --enable-lora --specialize-active-lora beside EAGLE's drafter: memory
    # profiling captures only the two largest LoRA cases of each mode, where the drafter's dummy run
    # runs eagerly (vLLM #28334's mitigation), so the KV cache is sized without the drafter's graphs
    # capture_model then captures in the cases without adapters (P10).
    "vllm_0_29": frozenset({"P0", "P1", "P3", "P4", "P7", "P10"}),
    # the drafter under a FULL target, and PIECEWISE after a late FULL -> FULL_AND_PIECEWISE
    # upgrade, reach no capturer (P1); micro-batching under FULL as every MRV1 revision (P4, P7).
    "pr56312_draft": frozenset({"P1", "P4", "P7", "P10"}),
    # spec §12.1's three leads: breakable + micro-batching and compiled-under-FULL-then-upgraded give
    # PIECEWISE no capturer (P1); breakable + FULL target + drafter captures outside the window (P4),
    # where the capture guard stops vLLM when serving (P0).
    "vllm_0_30": frozenset({"P0", "P1", "P4", "P7", "P10"}),
    # MRV2, both releases: compiled under FULL, resolved (or rewritten by adaptive verification) to
    # FULL_AND_PIECEWISE: target PIECEWISE has no capturer (lead L1); a draft model without an active
    # @support_torch_compile submodule under a compiled target: draft PIECEWISE has no capturer (L2).
    # Adaptive verification with a draft-only backend below UNIFORM_BATCH, which its check does not
    # read: resolve lowers the mode to PIECEWISE and vLLM stops at start-up (P0): the second
    # initialize_kv_cache asserts, or capture_model finds no FULL graph to profile.
    # Nothing under v1/worker/gpu/ reads speculative_config.enforce_eager: the drafter captures and
    # replays graphs the user asked it not to (P8).
    # Each pipeline stage resolves its own mode from its own layers' backends and nothing agrees the
    # padded token count across stages: a stage that pads beyond the rows an eager stage before it
    # sent raises in its copy (P9, and P0).
    "mrv2_0_33": frozenset({"P0", "P1", "P8", "P9"}),
    # and 0.34's draft prefill takes varlen decode graphs, which a draft-only UNIFORM_BATCH backend
    # without a varlen bound cannot replay (P7).
    "mrv2_0_34": frozenset({"P0", "P1", "P7", "P8", "P9"}),
}

# Why a counterexample cannot be confirmed on real code. Counterexamples against released vLLM
# are confirmed by `cudagraph-contract conform`, whose reports/conformance/*.json the reports read.
STATUS: dict[tuple[str, str], str] = {
    **{("pr56312_draft", p): "reading: the draft revision was never released, there is no real code to replay"
       for p in ("P1", "P4", "P7")},
    ("mrv2_0_33", "P1"): "reading: the MRV2 real-code replay is not part of this build yet",
    ("mrv2_0_34", "P1"): "reading: the MRV2 real-code replay is not part of this build yet",
}


def expected_holds(policy: str, prop: str) -> bool | None:
    """None for a policy with no expectation (a user's policy: every property should hold)."""
    if policy not in FAILS:
        return None
    return prop not in FAILS[policy]
