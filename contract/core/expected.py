"""The expected verdict table of the built-in policies: verdicts are data, checked by the tests.

``FAILS`` lists, per policy, the properties it is expected to violate. Every other property is
expected to hold.
"""

from __future__ import annotations

FAILS: dict[str, frozenset[str]] = {
    # FULL dispatches captured by the match-any breakable wrapper (P3); drafter PIECEWISE under a
    # FULL target captured at runtime with the capture guard off (P4); PIECEWISE with no capturer
    # under micro-batching or after a late upgrade (P1).
    "vllm_0_29": frozenset({"P1", "P3", "P4"}),
    # the drafter under a FULL target, and PIECEWISE after a late FULL -> FULL_AND_PIECEWISE
    # upgrade, reach no capturer (P1).
    "pr56312_draft": frozenset({"P1"}),
    # spec §12.1's three leads: breakable + micro-batching and compiled-under-FULL-then-upgraded give
    # PIECEWISE no capturer (P1); breakable + FULL target + drafter captures outside the window (P4).
    "vllm_0_30": frozenset({"P1", "P4"}),
    # MRV2, both releases: compiled under FULL, resolved (or rewritten by adaptive verification) to
    # FULL_AND_PIECEWISE: target PIECEWISE has no capturer (lead L1); a draft model without an active
    # @support_torch_compile submodule under a compiled target: draft PIECEWISE has no capturer (L2).
    "mrv2_0_33": frozenset({"P1"}),
    "mrv2_0_34": frozenset({"P1"}),
}

# Why a counterexample cannot be confirmed on real code. Counterexamples against released vLLM
# are confirmed by `cudagraph-contract conform`, whose reports/conformance/*.json the reports read.
STATUS: dict[tuple[str, str], str] = {
    ("pr56312_draft", "P1"): "reading: the draft revision was never released, there is no real code to replay",
    ("mrv2_0_33", "P1"): "reading: the MRV2 real-code replay is not part of this build yet",
    ("mrv2_0_34", "P1"): "reading: the MRV2 real-code replay is not part of this build yet",
}


def expected_holds(policy: str, prop: str) -> bool | None:
    """None for a policy with no expectation (a user's policy: every property should hold)."""
    if policy not in FAILS:
        return None
    return prop not in FAILS[policy]
