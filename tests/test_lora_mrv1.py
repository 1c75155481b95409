"""LoRA on Model Runner V1 (``--enable-lora``, 0.28.0 to 0.33.0): ``CudagraphDispatcher`` keys every
descriptor once per LoRA case, a batch of k adapters takes the smallest case >= k, ``capture_model``
captures each case with its dummy adapters selected, and the drafter's dummy run takes no graph in a
run with adapters (vLLM #28334's mitigation). Without it the drafter's graph, keyed without adapters,
is captured with them (P5); with it, memory profiling's two largest captures per mode are LoRA cases
and never capture the drafter (P10)."""

from __future__ import annotations

import pytest

from contract.core.classes import Severity, of_trace
from contract.core.events import START_UP, ExecuteModel, Propose
from contract.core.properties import LORA_SELECTED, check
from contract.core.scenario import DrafterKind, Runner, Scenario
from contract.core.trace import record, run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.runners.mrv1.model import cudagraph_dispatcher as dispatcher
from contract.runners.mrv1.model.cudagraph_dispatcher import DispatcherState

RELEASE = load_policy("vllm_0_30")
UNMITIGATED = mutant_policy(BY_NAME["drafter_graphs_in_lora_runs"])
ONE = Scenario(runner=Runner.MRV1, max_loras=1, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)
SPECIALISED = Scenario(runner=Runner.MRV1, max_loras=3, specialize_active_lora=True, drafter=DrafterKind.WITH_MODEL,
                       uniform_decode_query_len=2)
SERVE = [*START_UP, ExecuteModel(4, True, num_active_loras=1), ExecuteModel(3), Propose(4)]


def records(scenario, policy, events=SERVE):
    return run_events(scenario, policy, events)[0].records


def violations(scenario, policy, events=SERVE):
    return [v for r in records(scenario, policy, events) for v in check(r, scenario, Runner.MRV1)]


def test_the_dispatcher_keys_each_size_per_lora_case_and_rounds_an_active_count_up():
    """``initialize_cudagraph_keys``' ``product(sizes, lora_cases)`` and ``dispatch``'s ``bisect_left``
    over the captured counts (``33:v1/cudagraph_dispatcher.py:164-231``, ``:281-298``)."""
    d = dispatcher.initialize_cudagraph_keys(DispatcherState(1, lora_cases=(0, 1, 2, 4)), dispatcher.PIECEWISE, (2, 4))
    assert sorted((desc.num_tokens, desc.num_active_loras) for _, desc in d.keys) == [
        (2, 0), (2, 1), (2, 2), (2, 4), (4, 0), (4, 1), (4, 2), (4, 4)]
    assert [dispatcher.dispatch(d, 3, num_active_loras=k)[1].num_active_loras for k in range(4)] == [0, 1, 2, 4]
    assert dispatcher.dispatch(d, 3, num_active_loras=3)[1].has_lora
    descs = dispatcher.get_capture_descs(d)[0][1]
    assert [(b.num_tokens, b.num_active_loras) for b in descs[:3]] == [(4, 4), (4, 2), (4, 1)]


def test_capture_runs_select_their_cases_adapters_and_the_drafter_captures_only_without():
    steps = records(ONE, RELEASE)
    capture = [d for d in steps[4].dispatches]
    target = [(d.batch_descriptor.num_active_loras, d.selected_loras) for d in capture if d.role == "target"]
    assert {loras: selected for loras, selected in target} == {0: 0, 2: 1}  # case max + 1 selects max_loras
    drafted = [(d.selected_loras, d.runtime_mode.name) for d in capture if d.role == "drafter"]
    assert {mode for selected, mode in drafted if selected} == {"NONE"}
    assert ("PIECEWISE" in {mode for selected, mode in drafted if not selected})
    served = [d for r in steps[5:] for d in r.dispatches]
    assert [(d.role, d.batch_descriptor.num_active_loras, d.selected_loras) for d in served] == [
        ("target", 2, 0), ("target", 0, 0), ("drafter", 0, 0)]
    assert all(a.action.value == "replayed" for d in served for a in d.acting)
    assert not violations(ONE, RELEASE)


def test_the_unmitigated_drafter_graph_is_captured_with_adapters_its_key_does_not_name():
    """vLLM #28334: the drafter's PIECEWISE graph of a size is captured in the largest LoRA case's
    run, then replayed in the others' and for every batch: P5, an illegal memory access at start-up."""
    found = [v for v in violations(ONE, UNMITIGATED) if v.property == "P5"]
    assert found and all(LORA_SELECTED in v.message and v.message.startswith("drafter ") for v in found)
    assert "(1 selected by the capture run)" in found[0].message
    classes = of_trace(record(ONE, UNMITIGATED, SERVE), UNMITIGATED)
    assert {c.severity for c in classes if c.signature.property == "P5"} == {Severity.CRASH_START_UP}
    assert not [v for v in violations(ONE, RELEASE) if v.property == "P5"]


@pytest.mark.parametrize("policy", ["vllm_0_29", "vllm_0_30"])
def test_specialised_cases_leave_the_drafters_graphs_out_of_memory_profiling(policy):
    """``profile_cudagraph_memory`` captures each mode's two largest descriptors (``descs[:2]``,
    ``33:v1/worker/gpu_model_runner.py:6329-6330``): with ``--specialize-active-lora`` both are LoRA
    cases, where the mitigated drafter runs eagerly, so the drafter's graphs are never estimated."""
    found = {v.property for v in violations(SPECIALISED, load_policy(policy))}
    assert found == {"P10"}
    assert not violations(ONE, load_policy(policy))  # cases 2 and 0: the drafter is captured in the second
