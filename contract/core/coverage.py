"""Coverage cells: which (scenario class, resolved mode, role, runtime mode, acting layer) a
dispatch exercised. The explorer enumerates the reachable cells; the Hypothesis runs are measured
against them."""

from __future__ import annotations

from typing import NamedTuple

from contract.core.observation import StepRecord
from contract.core.scenario import Scenario, Speculator


class Cell(NamedTuple):
    scenario_class: str  # breakable, micro-batching, compiled inner PIECEWISE wrappers, drafter kind
    resolved_mode: str
    role: str
    runtime_mode: str
    acting: str  # "CUDAGraphWrapper(FULL) captured", "none", ...

    def __str__(self) -> str:
        return " | ".join(self)


def scenario_class(scenario: Scenario, compiled: bool | None) -> str:
    speculator = "" if scenario.speculator is Speculator.EAGLE else f"/{scenario.speculator.value}"
    return (f"B={int(scenario.breakable)} U={int(scenario.ubatching)} "
            f"compiled={int(bool(compiled))} drafter={scenario.drafter.value}{speculator}")


def cells_of(scenario: Scenario, state, record: StepRecord) -> set[Cell]:
    out = set()
    for d in record.dispatches:
        acting = d.acting
        who = "none" if not acting else " + ".join(
            f"{a.layer.split(':', 1)[1]} {a.action.value}" for a in acting)
        compiled = state.compiled_drafter if d.role == "drafter" else state.compiled_target
        out.add(Cell(scenario_class(scenario, compiled), state.cudagraph_mode.name, d.role, d.runtime_mode.name, who))
    return out
