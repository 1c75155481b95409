"""Run the Hypothesis machine against policies and build the verdict table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import Phase
from hypothesis import settings as Settings

from contract.core.coverage import cells_of
from contract.core.expected import expected_holds
from contract.core.machine import run_machine
from contract.core.policy import Policy
from contract.core.properties import PROPERTIES
from contract.core.stream import run_seed
from contract.core.trace import Trace, record


@dataclass(frozen=True)
class Verdict:
    policy: str
    property: str
    holds: bool
    trace: Trace | None = None  # Hypothesis's counterexample (shrunk unless the run asked otherwise)
    message: str = ""

    @property
    def length(self) -> int | None:
        return len(self.trace.events) if self.trace else None

    @property
    def drawn(self) -> int | None:
        """The length of the counterexample Hypothesis drew; None where it drew none, also where
        ``with_explorer`` completed the verdict from the explorer."""
        return self.length if self.trace is not None and self.trace.origin.get("engine") == "hypothesis" else None

    @property
    def expected(self) -> bool | None:
        return expected_holds(self.policy, self.property)

    @property
    def as_expected(self) -> bool:
        """A user policy is expected to hold everywhere."""
        expected = self.expected
        return self.holds if expected is None else self.holds == expected


def verify_policy(policy: Policy, settings: Settings, seed: int | None = None,
                  progress: Callable[[str], None] | None = None, cells: set | None = None,
                  shrink: bool = True) -> dict[str, Verdict]:
    """One verdict per property. A run stops at its first violation, so the property it shows is
    recorded and masked, and the machine runs again on the rest until a run finds nothing: the
    remaining properties held on every example of that run. ``cells``, when given, collects the
    coverage cells every executed step exercised. ``shrink=False`` keeps each counterexample as
    Hypothesis drew it: where the explorer runs beside, its shortest counterexample is the one shown,
    and shrinking was most of the run's time for about one event less."""
    if not shrink:
        settings = Settings(settings, phases=tuple(p for p in settings.phases if p is not Phase.shrink))
    on_step = None
    if cells is not None:
        def on_step(scenario, state, rec):
            cells.update(cells_of(scenario, state, rec))
    seed = run_seed(settings, seed)
    remaining = set(PROPERTIES)
    verdicts: dict[str, Verdict] = {}
    while remaining:
        if progress:
            progress(f"{policy.name}: checking {', '.join(sorted(remaining))}")
        found = run_machine(policy, settings, frozenset(remaining), seed, on_step=on_step)
        if found is None:
            break
        pid = found.violation.property
        trace = record(found.scenario, policy, found.events, name=f"{policy.name}-{pid}", prop=pid,
                       origin={"engine": "hypothesis", "seed": seed})
        verdicts[pid] = Verdict(policy.name, pid, False, trace, found.violation.message)
        remaining.discard(pid)
    for pid in remaining:
        verdicts[pid] = Verdict(policy.name, pid, True)
    return {pid: verdicts[pid] for pid in PROPERTIES}


def with_explorer(verdicts: dict[str, Verdict], exploration) -> dict[str, Verdict]:
    """The verdicts a run reports: Hypothesis's, except where it drew no counterexample of a property
    the exhaustive explorer of the same run shows; there the explorer's shortest. A verdict then never
    says a property holds while the same run reports one of its classes."""
    out = {}
    for pid, v in verdicts.items():
        trace = exploration.counterexamples.get(pid)
        if v.holds and trace is not None:
            v = Verdict(v.policy, pid, False, trace, f"shown by the explorer in {len(trace.events)} events; the "
                                                      "Hypothesis run drew no example of it")
        out[pid] = v
    return out
