"""The Hypothesis state machine: a scenario and a policy at ``@initialize``, the runner's events as
rules, the contract as an ``@invariant`` checked after every step."""

from __future__ import annotations

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, invariant, precondition, rule

from contract.events import CaptureModel, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Propose, Resolve
from contract.policy import Policy
from contract.properties import Violation, check
from contract.runner import Run
from contract.modes import AttentionCGSupport, CompilationMode, CUDAGraphMode
from contract.scenario import NUM_TOKENS_DOMAIN, DrafterKind, Runner, Scenario, SplittingOps


class ContractViolation(AssertionError):
    """The contract broke; carries the sequence so it can be written as a trace."""

    def __init__(self, violation: Violation, scenario: Scenario, events: list):
        super().__init__(f"{violation.property} at step {violation.step}: {violation.message}")
        self.violation, self.scenario, self.events = violation, scenario, list(events)


def _weighted(*pairs):
    """``sampled_from`` with integer weights; the first value is the one Hypothesis shrinks to."""
    return st.sampled_from([value for value, weight in pairs for _ in range(weight)])


@st.composite
def scenarios(draw, runner: Runner = Runner.MRV1) -> Scenario:
    """Every modelled setting, field by field; only combinations vLLM can express.

    Rarely used settings (micro-batching, n-gram drafters, ``speculative_config.enforce_eager``)
    are drawn less often, so sampling spends its examples where deployments are; the explorer
    enumerates every combination regardless.
    """
    drafter = draw(_weighted((DrafterKind.NONE, 2), (DrafterKind.WITH_MODEL, 2), (DrafterKind.WITHOUT_MODEL, 1)))
    has_spec = drafter is not DrafterKind.NONE
    return Scenario(
        runner=runner,
        breakable=draw(st.booleans()),
        ubatching=runner is Runner.MRV1 and draw(_weighted((False, 3), (True, 1))),
        cudagraph_mode=draw(st.sampled_from(CUDAGraphMode)),
        compilation_mode=draw(st.sampled_from(CompilationMode)),
        splitting_ops=draw(_weighted((SplittingOps.DEFAULT, 2), (SplittingOps.ATTENTION, 1), (SplittingOps.EMPTY, 1))),
        drafter=drafter,
        attention_support=draw(st.sampled_from(AttentionCGSupport)),
        spec_enforce_eager=has_spec and draw(_weighted((False, 3), (True, 1))),
        uniform_decode_query_len=(draw(st.sampled_from((2, 3) if runner is Runner.MRV1 else (2,))) if has_spec else 1),
    )


def make_machine(policy: Policy, only: frozenset[str] | None = None, base: Policy | None = None) -> type[RuleBasedStateMachine]:
    """A machine class for one policy, checking the properties in ``only`` (all when None).

    With ``base``, the machine runs ``policy`` (a mutant) and ``base`` in lockstep and fails where
    their verdicts differ: a property violated by one and not the other, or vLLM stopping in one only.
    """

    class ContractMachine(RuleBasedStateMachine):
        @initialize(scenario=scenarios(policy.runner))
        def setup(self, scenario: Scenario) -> None:
            self.scenario = scenario
            self.run = Run(scenario, policy)
            self.base_run = Run(scenario, base) if base is not None else None
            self.events: list = []
            self.last = self.base_last = None
            self._checked = True

        def _apply(self, event) -> None:
            self._checked = False
            self.events.append(event)
            if self.base_run is not None and not self.base_run.can(event):
                raise ContractViolation(
                    Violation("halt", len(self.events) - 1, f"{event.kind} is possible under {policy.name} only"),
                    self.scenario, self.events)
            self.last = self.run.apply(event)
            if self.base_run is not None:
                self.base_last = self.base_run.apply(event)

        def _can(self, event) -> bool:
            return hasattr(self, "run") and self.run.can(event)

        @precondition(lambda self: self._can(LoadModel()))
        @rule(profile_memory=st.booleans(), resolve_twice=st.booleans())
        def start_up(self, profile_memory: bool, resolve_twice: bool) -> None:
            """The worker's start-up, in its fixed order (spec §8.3); the choices are whether
            ``profile_cudagraph_memory`` runs (MRV1, mode != NONE) and whether resolve repeats."""
            script = [LoadModel(), ProfileRun()]
            script += [ProfileCudagraphMemory()] if profile_memory else []
            script += [Resolve(), Resolve()] if resolve_twice else [Resolve()]
            for event in [*script, CaptureModel()]:
                if self.run.can(event):
                    self._apply(event)
                    self._check()

        @precondition(lambda self: self._can(ExecuteModel(1)))
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN), uniform_decode=st.booleans(), force_eager=st.booleans())
        def execute_model(self, num_tokens: int, uniform_decode: bool, force_eager: bool) -> None:
            # A batch is uniform decode only when num_tokens is a multiple of the query length.
            uniform_decode = uniform_decode and num_tokens % self.scenario.uniform_decode_query_len == 0
            self._apply(ExecuteModel(num_tokens, uniform_decode, force_eager))

        @precondition(lambda self: self._can(Propose(1)))
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN))
        def propose(self, num_tokens: int) -> None:
            self._apply(Propose(num_tokens))

        @precondition(lambda self: hasattr(self, "run") and self.run.state.halted is not None)
        @rule()
        def halted(self) -> None:
            """vLLM stopped (a rejected config or a raised capture): nothing further happens."""

        @invariant()
        def contract(self) -> None:
            if getattr(self, "last", None) is not None and not self._checked:
                self._check()

        def _check(self) -> None:
            self._checked = True
            violations = check(self.last, self.scenario, policy.runner, only)
            if self.base_run is None:
                if violations:
                    raise ContractViolation(violations[0], self.scenario, self.events)
                return
            difference = verdict_difference(violations, check(self.base_last, self.scenario, base.runner, only),
                                             self.last, self.base_last, base.name)
            if difference:
                raise ContractViolation(difference, self.scenario, self.events)

    ContractMachine.__name__ = f"ContractMachine_{policy.name}"
    return ContractMachine


def verdict_difference(mine: list[Violation], theirs: list[Violation], record, base_record, base_name: str) -> Violation | None:
    """How a mutant's step differs from its base's: a property violated by one only, or a halt."""
    mine_ids, theirs_ids = {v.property for v in mine}, {v.property for v in theirs}
    for v in mine:
        if v.property not in theirs_ids:
            return Violation(v.property, v.step, f"new violation (not under {base_name}): {v.message}", v.dispatch)
    for v in theirs:
        if v.property not in mine_ids:
            return Violation(v.property, v.step, f"masks a violation of {base_name}: {v.message}", v.dispatch)
    if (record.halted is None) != (base_record.halted is None):
        which = record.halted or base_record.halted
        side = "the mutant" if record.halted else base_name
        return Violation("halt", record.index, f"only {side} stops here: {which}")
    return None


def run_machine(policy: Policy, settings: Settings, only: frozenset[str] | None = None, seed: int | None = None,
                base: Policy | None = None) -> ContractViolation | None:
    """Run the machine; the minimal (shrunk) violation, or None when every example held."""
    test = get_state_machine_test(make_machine(policy, only, base), settings=settings)
    if seed is not None:
        test._hypothesis_internal_use_seed = seed  # what @hypothesis.seed(seed) sets
    try:
        test()
    except ContractViolation as exc:
        return exc
    return None
