"""The Hypothesis state machine: a scenario and a policy at ``@initialize``, the runner's events as
rules, the contract as an ``@invariant`` checked after every step."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, precondition, rule

from contract.events import CaptureModel, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Propose, Resolve
from contract.policy import Policy
from contract.properties import Violation, check
from contract.engine import Run
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


FLEET = (1, 12)  # runners per example: min and max


class _Lane:
    """One runner of the fleet (and its base, in lockstep mode) with the events it took."""

    def __init__(self, scenario: Scenario, policy: Policy, base: Policy | None):
        self.scenario = scenario
        self.run = Run(scenario, policy)
        self.base_run = Run(scenario, base) if base is not None else None
        self.events: list = []


def make_machine(policy: Policy, only: frozenset[str] | None = None, base: Policy | None = None,
                 on_step: Callable | None = None, on_example: Callable | None = None) -> type[RuleBasedStateMachine]:
    """A machine class for one policy, checking the properties in ``only`` (all when None).

    ``@initialize`` draws a fleet of scenarios; every rule applies its event to each runner that can
    take it, and the contract is checked after every step of every runner. Hypothesis pays per
    rule, the model per runner, so a fleet explores several scenarios for the price of one; a
    counterexample keeps only the failing runner's scenario and events.

    With ``base``, each runner runs ``policy`` (a mutant) and ``base`` in lockstep and fails where
    their verdicts differ: a property violated by one and not the other, or vLLM stopping in one only.
    ``on_step(scenario, state, record)`` sees every step (coverage measurement).
    """

    class ContractMachine(RuleBasedStateMachine):
        @initialize(fleet=st.lists(policy.engine.scenarios(), min_size=FLEET[0], max_size=FLEET[1]))
        def setup(self, fleet: list[Scenario]) -> None:
            self.lanes = [_Lane(s, policy, base) for s in fleet]
            if on_example is not None:
                on_example()

        def _apply(self, event) -> bool:
            applied = False
            for lane in self.lanes:
                if lane.run.can(event):
                    self._step(lane, event)
                    applied = True
            return applied

        def _step(self, lane: _Lane, event) -> None:
            lane.events.append(event)
            if lane.base_run is not None and not lane.base_run.can(event):
                raise ContractViolation(
                    Violation("halt", len(lane.events) - 1, f"{event.kind} is possible under {policy.name} only"),
                    lane.scenario, lane.events)
            record = lane.run.apply(event)
            if on_step is not None:
                on_step(lane.scenario, lane.run.state, record)
            violations = check(record, lane.scenario, policy.runner, only)
            if lane.base_run is None:
                if violations:
                    raise ContractViolation(violations[0], lane.scenario, lane.events)
                return
            base_record = lane.base_run.apply(event)
            difference = verdict_difference(violations, check(base_record, lane.scenario, base.runner, only),
                                            record, base_record, base.name)
            if difference:
                raise ContractViolation(difference, lane.scenario, lane.events)

        def _can(self, event) -> bool:
            return any(lane.run.can(event) for lane in getattr(self, "lanes", ()))

        @precondition(lambda self: self._can(LoadModel()))
        @rule(kv_cache_memory_bytes=st.booleans())
        def start_up(self, kv_cache_memory_bytes: bool) -> None:
            """The worker's start-up in its fixed order (spec §8.3). ``profile_cudagraph_memory``
            runs unless ``--kv-cache-memory-bytes`` is set, which skips memory profiling
            (``v1/worker/gpu_worker.py:542-585`` in 0.30.0); the default path shrinks first."""
            script = [LoadModel(), ProfileRun()]
            script += [] if kv_cache_memory_bytes else [ProfileCudagraphMemory()]
            for event in [*script, Resolve(), CaptureModel()]:
                self._apply(event)

        @precondition(lambda self: self._can(ExecuteModel(1)))
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN), uniform_decode=st.booleans(), force_eager=st.booleans())
        def execute_model(self, num_tokens: int, uniform_decode: bool, force_eager: bool) -> None:
            # A batch is uniform decode only when num_tokens is a multiple of the runner's query
            # length; the others take it as a mixed batch.
            for lane in self.lanes:
                uniform = uniform_decode and num_tokens % lane.scenario.uniform_decode_query_len == 0
                event = ExecuteModel(num_tokens, uniform, force_eager)
                if lane.run.can(event):
                    self._step(lane, event)

        @precondition(lambda self: self._can(Propose(1)))
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN))
        def propose(self, num_tokens: int) -> None:
            self._apply(Propose(num_tokens))

        if getattr(policy.engine, "UNIFORM_PROPOSE", False):
            @precondition(lambda self: self._can(Propose(1)))
            @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN))
            def propose_uniform(self, num_tokens: int) -> None:
                """A draft after a uniform decode batch, in each runner whose query length divides it."""
                for lane in self.lanes:
                    event = Propose(num_tokens, num_tokens % lane.scenario.uniform_decode_query_len == 0)
                    if lane.run.can(event):
                        self._step(lane, event)

        @precondition(lambda self: hasattr(self, "lanes") and all(lane.run.state.halted for lane in self.lanes))
        @rule()
        def halted(self) -> None:
            """vLLM stopped in every runner (a rejected config or a raised capture)."""

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
                base: Policy | None = None, on_step: Callable | None = None,
                stats: dict | None = None) -> ContractViolation | None:
    """Run the machine; the minimal (shrunk) violation, or None when every example held.
    ``stats["examples"]`` counts the examples Hypothesis ran (shrinking included)."""
    on_example = None
    if stats is not None:
        stats["examples"] = 0

        def on_example():
            stats["examples"] += 1

    test = get_state_machine_test(make_machine(policy, only, base, on_step, on_example), settings=settings)
    if seed is not None:
        test._hypothesis_internal_use_seed = seed  # what @hypothesis.seed(seed) sets
    try:
        test()
    except ContractViolation as exc:
        return exc
    return None
