"""The severity of a traced finding's class signature (``Signature.to_json()``), on the scale every
class carries (``contract.core.classes.Severity``), and which signatures are findings at all.

The deciding data of ``reports/conformance/deciding/`` may predate P0 and name a stop ``halt``
("vLLM stops"): such a stop is a crash when serving where its exception is the capture guard's
(``CAPTURE_GUARD_ERROR``, raised by a forward while serving) and a crash at start-up otherwise (an
assertion or error while resolving or capturing).

vLLM refusing a configuration on purpose (a ``ValueError`` with an explanation: ``resolve
rejected: ...``, an accepted rejection) is no finding.
"""

from __future__ import annotations

from contract.core.classes import (
    HALT,
    REJECTED,
    STOPS_AT_START_UP,
    STOPS_WHEN_SERVING,
    Severity,
    Signature,
)
from contract.core.classes import severity as class_severity
from contract.core.halts import CAPTURE_GUARD_ERROR

REFUSAL = "resolve rejected"  # vLLM's own ValueError at resolve (contract/real/errors.py)


def finding(signature: dict) -> bool:
    """Whether a confirmed class of this signature is a finding (not vLLM refusing on purpose)."""
    if signature.get("property") == REJECTED:
        return False
    return not (signature.get("property") in (HALT, "P0") and str(signature.get("detail", "")).startswith(REFUSAL))


def of(signature: dict) -> Severity:
    """The severity of a class signature."""
    prop, what, detail = signature.get("property", ""), signature.get("what", ""), str(signature.get("detail", ""))
    if prop == HALT:
        prop, what = "P0", STOPS_WHEN_SERVING if detail.startswith(CAPTURE_GUARD_ERROR) else STOPS_AT_START_UP
    return class_severity(Signature(prop, signature.get("role", "-"), signature.get("runtime_mode", "-"), what, detail))


def worst(severities) -> Severity:
    return min(severities, key=lambda s: s.rank)
