"""LoRA in Model Runner V2's descriptors (``--enable-lora --max-loras N``): the target's graphs are
captured once per LoRA case, a batch of k active adapters dispatches to the smallest case >= k, the
compiled pieces are keyed by the LoRA fields serving's forward context carries, and P7 holds a LoRA
batch to a graph captured for at least its adapters, with its case's dummy adapters selected. The
drafter runs none. The replay runs vLLM's
own ``get_lora_capture_cases``, ``get_num_active_loras_for_dispatch`` over its ``LoraState`` and the
mixin's dummy adapters in ``capture_model``; an edited 0.34.0 tree whose capture drops the LoRA
count from the compiled pieces' key is a new class."""

from __future__ import annotations

import json

import pytest

from contract.core.classes import Severity, of_trace
from contract.core.lora import lora_capture_cases
from contract.core.events import START_UP, ExecuteModel, Propose, event_from_json, event_to_json
from contract.core.properties import check
from contract.core.scenario import DrafterKind, Runner, Scenario
from contract.core.trace import TraceError, load, record, record_runnable, run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.evidence import reach, requests
from contract.runners.mrv2.model import cudagraph_utils as cgu

LORA = Scenario(runner=Runner.MRV2, max_loras=1)
SERVE = [*START_UP, ExecuteModel(3), ExecuteModel(3, num_active_loras=1), ExecuteModel(4, True, num_active_loras=1)]


def records(scenario, policy, events=SERVE):
    return run_events(scenario, policy, events)[0].records


def test_capture_cases_and_the_dispatch_map_are_vllms():
    """``get_lora_capture_cases`` under the default ``cudagraph_specialize_lora``: 0 and N + 1, or with
    ``specialize_active_lora`` the powers of 2 up to N and N + 1; k adapters take the smallest case >= k."""
    assert lora_capture_cases(0, False) == (0,)
    assert lora_capture_cases(1, False) == (0, 2)
    assert lora_capture_cases(3, True) == (0, 1, 2, 4)
    assert [cgu.effective_loras((0, 1, 2, 4), k) for k in range(5)] == [0, 1, 2, 4, 4]
    assert [cgu.effective_loras((0, 2), k) for k in range(3)] == [0, 2, 2]


@pytest.mark.parametrize("policy", ["mrv2_0_33", "mrv2_0_34"])
def test_every_descriptor_is_captured_per_lora_case_and_a_lora_batch_replays_its_own(policy):
    steps = records(LORA, load_policy(policy))
    captured = [d.batch_descriptor for d in steps[4].dispatches]
    assert {d.num_active_loras for d in captured} == {0, 2} and len(captured) % 2 == 0
    served = [d for r in steps[5:] for d in r.dispatches]
    assert [d.batch_descriptor.num_active_loras for d in served] == [0, 2, 2]
    assert all(a.action.value == "replayed" for d in served for a in d.acting)
    assert not [v for r in steps for v in check(r, LORA, Runner.MRV2)]


def test_the_drafter_runs_without_adapters():
    """``34:v1/worker/gpu/spec_decode/eagle/utils.py:92-94``: the drafter does not use the target's LoRA
    adapter; its managers capture and dispatch LoRA case 0 only."""
    scenario = Scenario(runner=Runner.MRV2, max_loras=1, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)
    events = [*START_UP, ExecuteModel(4, True, num_active_loras=1), Propose(4, True)]
    steps = records(scenario, load_policy("mrv2_0_34"), events)
    drafter = [d for r in steps for d in r.dispatches if d.role == "drafter"]
    assert drafter and all(d.batch_descriptor.num_active_loras == 0 for d in drafter)
    assert not [v for r in steps for v in check(r, scenario, Runner.MRV2)]


def test_p7_holds_a_lora_batch_to_a_graph_of_its_adapters_and_ranks_it_a_wrong_result():
    policy = mutant_policy(BY_NAME["mrv2_lora_dispatch_ignores_active"])
    violations = [v for r in records(LORA, policy) for v in check(r, LORA, Runner.MRV2) if v.property == "P7"]
    assert [v.step for v in violations] == [6, 7], violations
    assert "a graph captured for the LoRA case 0 served a batch of 1 active LoRA adapter(s)" in violations[0].message
    classes = of_trace(record(LORA, policy, SERVE), policy)
    assert {c.severity for c in classes if c.signature.property == "P7"} == {Severity.WRONG_RESULT}


def test_each_lora_case_is_captured_with_its_dummy_adapters_selected():
    """``capture_model``'s LoRA capture hook selects ``min(k, max_loras)`` dummy adapters for the case k
    (vLLM #35536); without it the case's graph records no LoRA kernel, a wrong result for the batches
    it serves, at its capture."""
    steps = records(LORA, load_policy("mrv2_0_34"))
    captures = [d for d in steps[4].dispatches if d.role == "target"]
    assert {(d.batch_descriptor.num_active_loras, d.selected_loras) for d in captures} == {(0, 0), (2, 1)}
    policy = mutant_policy(BY_NAME["mrv2_lora_capture_selects_no_adapters"])
    violations = [v for r in records(LORA, policy) for v in check(r, LORA, Runner.MRV2) if v.property == "P7"]
    assert violations and {v.step for v in violations} == {4}, violations
    assert "captured without the dummy adapters of its case (0 of 1 selected)" in violations[0].message
    classes = of_trace(record(LORA, policy, SERVE), policy)
    assert {c.severity for c in classes if c.signature.property == "P7"} == {Severity.WRONG_RESULT}


def test_0_33_capture_without_has_lora_captures_again_when_serving():
    """vLLM #43160's bug: the capture's forward context without ``has_lora``, serving's with it."""
    policy = mutant_policy(BY_NAME["mrv2_lora_capture_key_without_has_lora"])
    assert {v.property for r in records(LORA, policy)[5:] for v in check(r, LORA, Runner.MRV2)} == {"P4", "P5"}
    assert not [v for r in records(LORA, load_policy("mrv2_0_33")) for v in check(r, LORA, Runner.MRV2)]


def test_a_batch_asks_for_no_more_adapters_than_max_loras_and_its_requests(tmp_path):
    trace = record_runnable(LORA, load_policy("mrv2_0_34"), SERVE, name="lora")
    data = json.loads(trace.dumps())
    assert data["events"][6] == {"event": "execute_model", "num_tokens": 3, "uniform_decode": False,
                                 "force_eager": False, "num_active_loras": 1}
    assert event_from_json(event_to_json(SERVE[6])) == SERVE[6]
    for events, why in (([*data["events"][:5], {"event": "execute_model", "num_tokens": 3, "num_active_loras": 2}],
                         r"at most max_loras \(1\)"),
                        ([{"event": "execute_model", "num_tokens": 3, "num_active_loras": -1}], "non-negative")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**data, "events": events}))
        with pytest.raises(TraceError, match=why):
            load(path)
    with pytest.raises(ValueError, match="LoRA is modelled on one DP rank"):
        Scenario(runner=Runner.MRV1, max_loras=1, data_parallel_size=2)
    with pytest.raises(ValueError, match="specialize_active_lora needs LoRA"):
        Scenario(runner=Runner.MRV2, specialize_active_lora=True)


def test_the_serve_command_enables_lora_and_the_requests_name_their_adapters():
    found = reach.reach(Scenario(runner=Runner.MRV2, max_loras=3, specialize_active_lora=True), "0.34.0")
    assert found.reachable, found.reason
    assert found.plan.extra[-4:] == ("--enable-lora", "--max-loras", "3", "--specialize-active-lora")
    trace = record_runnable(LORA, load_policy("mrv2_0_34"), [*START_UP, ExecuteModel(4, True, num_active_loras=1)],
                            name="lora")
    need = requests.need(trace)
    assert need.adapters == 1 and "naming a LoRA adapter of its own" in need.what
    assert "m=adapter-$i" in requests.curl(reach.DENSE, need)


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_capture_drops_the_lora_count_is_a_new_class(tmp_path):
    """The 0.34.0 twin of vLLM #43160: the capture's forward context keys the compiled pieces without
    ``num_active_loras``, so a PIECEWISE LoRA batch finds no graph and captures while serving."""
    from vllm_envs import conform_tree, edited_tree

    tree = edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/cudagraph_utils.py",
                       "                    batch_descriptor = BatchDescriptor(\n"
                       "                        num_tokens=num_tokens,\n"
                       "                        num_active_loras=desc.num_active_loras,\n"
                       "                    )\n",
                       "                    batch_descriptor = BatchDescriptor(\n"
                       "                        num_tokens=num_tokens,\n"
                       "                    )\n")
    data = conform_tree(tree, record_runnable(LORA, load_policy("mrv2_0_34"), SERVE, name="lora"), tmp_path)
    new = {c["property"] for c in data["new"]}
    assert "P4" in new and all(c["role"] == "target" for c in data["new"]), data["new"]


def test_a_step_that_differs_only_in_the_selected_adapters_says_them():
    """``conform --vllm-src``'s list of differing steps names the dummy adapters each capture ran with,
    where the layers and descriptors are the same on both sides."""
    from contract.branch.conform import StepChange
    from contract.cli.branch import _step_line

    def step(selected):
        dispatch = {"role": "target", "runtime_mode": "FULL", "layers": [{"layer": "target:CudaGraphManager",
                    "action": "captured"}], "batch_descriptor": {"num_tokens": 2, "num_active_loras": 2}}
        return {"dispatches": [dispatch | ({"selected_loras": selected} if selected else {})]}

    line = _step_line(StepChange("t", 4, "capture_model", step(1), step(0)))
    assert "base target FULL (num_tokens=2, num_active_loras=2, selected_loras=1)" in line, line
    assert "branch target FULL (num_tokens=2, num_active_loras=2): target:CudaGraphManager captured" in line, line
