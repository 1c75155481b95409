"""Micro-batching (``--enable-dbo``, ``--ubatch-size N``) on Model Runner V2: each FULL descriptor whose
requests split evenly has a twin captured for the step's micro-batches, keyed by its requests' query
length; several DP
ranks agree on micro-batching when the smallest batch reaches the threshold. P7 holds a
micro-batched FULL graph replayed for a mixed batch to be a wrong result. An edited 0.34.0 tree
whose twin serves any batch is a new class on vLLM's own code."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from contract.core.classes import Severity, of_trace
from contract.core.events import START_UP, ExecuteModel, Peer
from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, PIECEWISE, CUDAGraphMode
from contract.core.properties import UBATCH_MIXED
from contract.core.scenario import DrafterKind, Runner, Scenario
from contract.core.trace import TraceError, loads, record_runnable, run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.core.ubatch_utils import UBatching
from contract.runners.mrv2.model.ubatch_utils import ubatch_twin, ubatching

MUTANT = BY_NAME["mrv2_ubatch_twin_any_batch"]
TWIN_FILE = "v1/worker/gpu/cudagraph_utils.py"
TWIN_RETURN = "desc, num_ubatches=num_ubatches, uniform_token_count=uniform_token_count\n"


def _dbo(mode: CUDAGraphMode, **fields) -> Scenario:
    return Scenario(runner=Runner.MRV2, cudagraph_mode=mode, data_parallel_size=2, ubatching=True, **fields)


def _served(scenario: Scenario, policy, *steps: ExecuteModel):
    run, violations = run_events(scenario, policy, [*START_UP, *steps])
    return [(r.dispatches[0].runtime_mode, r.dispatches[0].batch_descriptor) for r in run.records[-len(steps):]], \
        violations


@pytest.mark.parametrize("mode", [FULL_AND_PIECEWISE, FULL, FULL_DECODE_ONLY])
def test_decode_batches_on_both_ranks_replay_the_micro_batched_twin(mode):
    served, violations = _served(_dbo(mode), load_policy("mrv2_0_34"),
                                 ExecuteModel(3, True, peers=(Peer(2, True),)),
                                 ExecuteModel(2, True, peers=(Peer(0),)))
    assert not violations
    # 3 and 2 decode tokens: the smallest reaches the decode threshold (2), both pad to the 4-request twin
    (mode_a, twin), (mode_b, alone) = served
    assert (mode_a, twin.num_tokens, twin.num_ubatches, twin.uniform_token_count) == (FULL, 4, 2, 1)
    # an idle rank's dummy batch (1 token) is below the threshold: the ranks agree without splitting
    assert mode_b == FULL and alone.num_ubatches == 1


def test_a_mixed_batch_over_the_prefill_threshold_runs_eagerly_in_micro_batches():
    served, violations = _served(_dbo(FULL), load_policy("mrv2_0_34"), ExecuteModel(4, False, peers=(Peer(4, False),)))
    assert not violations
    assert [(m, d.num_ubatches) for m, d in served] == [(NONE, 2)]


def test_twins_follow_the_full_descriptors_that_split_at_the_decode_threshold():
    u = UBatching(2, 4, 4)
    m = cgu.build("target:CudaGraphManager", "0.34", FULL, (2, 4), 1, target_q=1, use_breakable_cg=False,
                  ubatching=u)
    full = dict(m.capture_descs)[FULL]
    assert [str(d) for d in full] == ["BED(FULL,4,4)", "BED(FULL,4,4,utc=1,ubatches=2)", "BED(FULL,2,2)"]
    captured = replace(m, graphs_captured=True)
    assert cgu.dispatch(captured, 4, 4, None, num_ubatches=2).cg_mode == NONE
    assert cgu.dispatch(captured, 4, 4, 1, num_ubatches=2) == full[1]


def test_the_runner_exists_on_several_ranks_only_and_speculation_raises_the_thresholds():
    assert ubatching(Scenario(runner=Runner.MRV2), "0.34") is None
    assert ubatching(_dbo(FULL), "0.34") == UBatching(2, 2, 4)
    with pytest.raises(ValueError, match="several DP ranks"):
        Scenario(runner=Runner.MRV2, ubatching=True)
    with pytest.raises(ValueError, match="PIECEWISE"):
        _dbo(PIECEWISE)
    with pytest.raises(ValueError, match="without a drafter"):
        _dbo(FULL, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)


def test_three_micro_batches_twin_the_descriptors_of_at_least_three_tokens():
    """--ubatch-size 3: the thresholds rise to the count (vLLM refuses less), the 2-token descriptor has
    no twin, and decode steps whose smallest batch reaches 3 tokens replay the 4-token twin of 3."""
    scenario = _dbo(FULL, ubatch_size=3)
    assert (scenario.num_ubatches, ubatching(scenario, "0.34")) == (3, UBatching(3, 3, 4))
    m = cgu.build("target:CudaGraphManager", "0.34", FULL, (2, 4), 1, target_q=1, use_breakable_cg=False,
                  ubatching=ubatching(scenario, "0.34"))
    assert [str(d) for d in dict(m.capture_descs)[FULL]] == ["BED(FULL,4,4)", "BED(FULL,4,4,utc=1,ubatches=3)",
                                                             "BED(FULL,2,2)"]
    served, violations = _served(scenario, load_policy("mrv2_0_34"), ExecuteModel(3, True, peers=(Peer(4, True),)),
                                 ExecuteModel(2, True, peers=(Peer(4, True),)))
    assert not violations
    (mode_a, twin), (mode_b, alone) = served
    assert (mode_a, twin.num_tokens, twin.num_ubatches, twin.uniform_token_count) == (FULL, 4, 3, 1)
    assert mode_b == FULL and alone.num_ubatches == 1
    for size in (2, 4):
        with pytest.raises(ValueError, match="micro-batch count"):
            _dbo(FULL, ubatch_size=size)


def test_a_twin_of_dbos_two_micro_batches_under_ubatch_size_3_loses_the_decode_graph():
    """A twin rule that keeps --enable-dbo's count whatever --ubatch-size (a hand-edited 0.34.0 tree:
    ``verify --vllm-src`` and ``conform --vllm-src --base 0.34.0`` show it as lost graphs): the
    agreement asks for three micro-batches, no twin of three exists, and the step runs eagerly."""
    released = load_policy("mrv2_0_34")
    two = replace(released, ubatch_twin=lambda u, desc, **kw: ubatch_twin(u and replace(u, num_ubatches=2), desc, **kw))
    step = ExecuteModel(3, True, peers=(Peer(4, True),))
    [(mode, desc)], _ = _served(_dbo(FULL, ubatch_size=3), released, step)
    assert (mode, desc.num_ubatches) == (FULL, 3)
    [(mode, desc)], _ = _served(_dbo(FULL, ubatch_size=3), two, step)
    assert (mode, desc.num_ubatches) == (NONE, 3)


def test_a_trace_forcing_eager_on_a_micro_batching_scenario_is_refused():
    policy = load_policy("mrv2_0_34")
    data = record_runnable(_dbo(FULL), policy, [*START_UP, ExecuteModel(4, True, peers=(Peer(4, True),))],
                           name="dbo").to_json()
    data["events"][-1]["force_eager"] = True
    with pytest.raises(TraceError, match="encoder-decoder models"):
        loads(json.dumps(data))


def test_the_mutants_twin_serves_a_mixed_batch_a_p7_wrong_result():
    policy = mutant_policy(MUTANT)
    trace = record_runnable(_dbo(FULL), policy, [*START_UP, ExecuteModel(4, False, peers=(Peer(4, False),))], name="dbo")
    classes = of_trace(trace, policy)
    assert [(c.signature.property, c.signature.what, c.severity) for c in classes] == [
        ("P7", UBATCH_MIXED, Severity.WRONG_RESULT)]
    assert not of_trace(record_runnable(_dbo(FULL), load_policy("mrv2_0_34"), trace.events, name="dbo"),
                        load_policy("mrv2_0_34"))


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_twin_serves_any_batch_is_a_new_p7_wrong_result(tmp_path):
    """The reviewer's path: ``_maybe_ubatch_twin`` without its ``uniform_token_count``, on vLLM's own
    code with two DP ranks joined by gloo."""
    from vllm_envs import conform_tree, edited_tree

    tree = edited_tree(tmp_path, "0.34.0", TWIN_FILE, TWIN_RETURN, "desc, num_ubatches=num_ubatches\n")
    trace = record_runnable(_dbo(FULL), mutant_policy(MUTANT),
                            [*START_UP, ExecuteModel(4, False, peers=(Peer(4, False),))], name="dbo")
    data = conform_tree(tree, trace, tmp_path)
    new = [c for c in data["new"] if c["property"] == "P7"]
    assert new and all(c["what"] == UBATCH_MIXED for c in new), data["new"]
