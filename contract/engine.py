"""The runner a policy models, behind one interface: MRV1 is ``contract.runner``, MRV2
``contract.mrv2.model_runner``. Each policy names its own (``policy.engine``); nothing here branches
on the runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.events import Event
from contract.observation import StepRecord
from contract.scenario import Scenario


def initial_state(scenario: Scenario, policy):
    return policy.engine.initial_state(scenario, policy)


def enabled(scenario: Scenario, policy, state, event: Event) -> bool:
    return policy.engine.enabled(scenario, policy, state, event)


def step(scenario: Scenario, policy, state, event: Event, index: int = 0) -> tuple[object, StepRecord]:
    return policy.engine.step(scenario, policy, state, event, index)


@dataclass
class Run:
    """A scenario run under a policy, event by event (the model side of a trace)."""

    scenario: Scenario
    policy: object
    state: object = field(init=False)
    records: list[StepRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = initial_state(self.scenario, self.policy)

    def can(self, event: Event) -> bool:
        return enabled(self.scenario, self.policy, self.state, event)

    def apply(self, event: Event) -> StepRecord:
        self.state, record = step(self.scenario, self.policy, self.state, event, len(self.records))
        self.records.append(record)
        return record
