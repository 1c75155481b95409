"""The Hypothesis state machine: a scenario and a policy at ``@initialize``, the runner's events as
rules, the contract as an ``@invariant`` checked after every step."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, get_state_machine_test, initialize, precondition, rule

from contract.core.events import (
    CaptureModel,
    ExecuteModel,
    LoadModel,
    Peer,
    ProfileCudagraphMemory,
    ProfileRun,
    Propose,
    Resolve,
    batch_requests,
)
from contract.core.policy import Policy
from contract.core.properties import Violation, check, verdict_difference
from contract.core.engine import Run
from contract.core.scenario import MAX_DATA_PARALLEL_SIZE, MAX_NUM_SEQS, NUM_TOKENS_DOMAIN, Scenario
from contract.core.stream import pinned_stream, seed_for


class ContractViolation(AssertionError):
    """The contract broke; carries the sequence so it can be written as a trace."""

    def __init__(self, violation: Violation, scenario: Scenario, events: list):
        super().__init__(f"{violation.property} at step {violation.step}: {violation.message}")
        self.violation, self.scenario, self.events = violation, scenario, list(events)


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
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN), uniform_decode=st.booleans(), force_eager=st.booleans(),
              data=st.data())
        def execute_model(self, num_tokens: int, uniform_decode: bool, force_eager: bool, data) -> None:
            # A batch is uniform decode only when num_tokens is a multiple of the runner's query
            # length; the others take it as a mixed batch. In a runner with LoRA its requests ask
            # for a drawn number of adapters, drawn only there: a fleet without LoRA draws as before.
            for lane in self.lanes:
                q = lane.scenario.uniform_decode_query_len
                event = ExecuteModel(num_tokens, uniform_decode and num_tokens % q == 0, force_eager)
                if lane.scenario.max_loras and lane.run.can(event):
                    most = min(lane.scenario.max_loras, batch_requests(event, q, MAX_NUM_SEQS))
                    event = replace(event, num_active_loras=data.draw(st.integers(0, most)))
                if lane.run.can(event):
                    self._step(lane, event)

        if policy.engine.data_parallel:
            @precondition(lambda self: any(lane.scenario.data_parallel_size > 1 and lane.run.state.captured
                                           and not lane.run.state.halted for lane in getattr(self, "lanes", ())))
            @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN), uniform_decode=st.booleans(), force_eager=st.booleans(),
                  peers=st.lists(st.tuples(st.sampled_from((0, *NUM_TOKENS_DOMAIN)), st.booleans(), st.booleans()),
                                 min_size=MAX_DATA_PARALLEL_SIZE - 1, max_size=MAX_DATA_PARALLEL_SIZE - 1))
            def execute_model_on_ranks(self, num_tokens: int, uniform_decode: bool, force_eager: bool,
                                       peers: list[tuple[int, bool, bool]]) -> None:
                """One step on every data-parallel rank of each runner that has several: this rank's
                batch and the first ``data_parallel_size - 1`` peers' (0 tokens: an idle rank)."""
                for lane in self.lanes:
                    q, ranks = lane.scenario.uniform_decode_query_len, lane.scenario.data_parallel_size
                    uniform = uniform_decode and num_tokens % q == 0
                    eager = not lane.scenario.micro_batched  # no batch needs eager there: the draw reads as none
                    batches = tuple(Peer(n, u and n > 0 and n % q == 0, e and eager and n > 0)
                                    for n, u, e in peers[:ranks - 1])
                    event = ExecuteModel(num_tokens, uniform, force_eager and eager, batches)
                    if ranks > 1 and lane.run.can(event):
                        self._step(lane, event)

        @precondition(lambda self: self._can(Propose(1)))
        @rule(num_tokens=st.sampled_from(NUM_TOKENS_DOMAIN))
        def propose(self, num_tokens: int) -> None:
            self._apply(Propose(num_tokens))

        if policy.engine.uniform_propose:
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


def run_machine(policy: Policy, settings: Settings, only: frozenset[str] | None = None, seed: int | None = None,
                base: Policy | None = None, on_step: Callable | None = None,
                stats: dict | None = None) -> ContractViolation | None:
    """Run the machine; the first violation (shrunk unless ``settings`` drop ``Phase.shrink``), or
    None when every example held. The examples are a function of ``settings`` and ``seed`` alone
    (``contract.core.stream``).
    ``stats["examples"]`` counts the examples Hypothesis ran (shrinking included)."""
    on_example = None
    if stats is not None:
        stats["examples"] = 0

        def on_example():
            stats["examples"] += 1

    test = get_state_machine_test(make_machine(policy, only, base, on_step, on_example), settings=settings)
    seed = seed_for(settings, seed)
    if seed is not None:
        test._hypothesis_internal_use_seed = seed  # what @hypothesis.seed(seed) sets
    try:
        with pinned_stream():
            test()
    except ContractViolation as exc:
        return exc
    return None
