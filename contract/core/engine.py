"""A runner's model behind one interface: the pure step functions and the space they run over.

Each runner family (``contract/runners/``) builds one ``Engine``; a policy names its family's
(``policy.engine``), so the machine, the explorer and traces never branch on the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from contract.core.events import Event
from contract.core.observation import StepRecord
from contract.core.scenario import Runner, Scenario


@dataclass(frozen=True)
class Engine:
    """One runner's model. ``initial_state(scenario, policy)`` is the state after vLLM's config and
    the runner's constructor; ``enabled`` says which events the runner can take next; ``step``
    applies one and reports what it showed. ``alphabet(scenario)`` lists every event the explorer
    tries; ``canonical_scenarios(policy)`` one scenario per behaviour class; ``scenarios()`` the
    Hypothesis strategy of the runner's settings; ``uniform_propose``: draft prefills after uniform
    batches are a distinct event; ``data_parallel``: its scenarios can run on several DP ranks."""

    runner: Runner
    initial_state: Callable
    enabled: Callable
    step: Callable
    alphabet: Callable[[Scenario], tuple]
    canonical_scenarios: Callable
    scenarios: Callable
    uniform_propose: bool = False
    data_parallel: bool = False  # scenarios on several DP ranks, whose steps name the peers' batches


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
