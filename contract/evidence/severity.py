"""How bad a violation kind is, for the triage table: a stand-in, derived from the class signature
alone, until the violation classes carry a severity of their own (``contract/core/classes.py``).

Order, worst first: **crash** (vLLM stops with an exception: a halt, a capture the guard refuses
(P4 raised), a nested capture), **wrong result** (a replay of an entry captured for another mode or
step, P5; a NONE dispatch captured, P2; ``get_model()`` stopping at a wrapper, P6), **silent
runtime capture** (a capture outside the capture phase that nothing refuses, MRV2's P4), **silent
eager fallback** (P1, no capturer), **log only** (P3: the graph exists, another layer than the
one the mode names captured it).

A halt whose message is vLLM's own refusal of the configuration at resolve (``resolve rejected:
...``, a ``ValueError`` vLLM raises with an explanation) is no finding: it is what vLLM does on
purpose. ``finding`` says which signatures are findings at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.core.classes import (CROSS_MODE_REPLAY, HALT, NESTED, NO_CAPTURER, NONE_CAPTURED, OUTSIDE_WINDOW,
                                   OUTSIDE_WINDOW_SILENT, RECAPTURE, UNWRAP_STOPS, WRONG_CAPTURER)


@dataclass(frozen=True, order=True)
class Severity:
    rank: int  # higher is worse
    name: str


CRASH = Severity(5, "crash")
WRONG_RESULT = Severity(4, "wrong result")
SILENT_CAPTURE = Severity(3, "silent runtime capture")
SILENT_EAGER = Severity(2, "silent eager fallback")
LOG_ONLY = Severity(1, "log only")

_BY_WHAT = {
    NESTED: CRASH, OUTSIDE_WINDOW: CRASH,
    CROSS_MODE_REPLAY: WRONG_RESULT, RECAPTURE: WRONG_RESULT, NONE_CAPTURED: WRONG_RESULT, UNWRAP_STOPS: WRONG_RESULT,
    OUTSIDE_WINDOW_SILENT: SILENT_CAPTURE,
    NO_CAPTURER: SILENT_EAGER,
    WRONG_CAPTURER: LOG_ONLY,
}
REFUSAL = "resolve rejected"  # vLLM's own ValueError at resolve (contract/real/errors.py)


def finding(signature: dict) -> bool:
    """Whether a confirmed class of this signature is a finding (not vLLM refusing on purpose)."""
    return not (signature.get("property") == HALT and str(signature.get("detail", "")).startswith(REFUSAL))


def of(signature: dict) -> Severity:
    """The severity of a class signature (``Signature.to_json()``)."""
    if signature.get("property") == HALT:
        return CRASH
    return _BY_WHAT.get(signature.get("what", ""), SILENT_EAGER)
