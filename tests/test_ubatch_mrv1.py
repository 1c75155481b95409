"""Micro-batching (``--enable-dbo``, ``--ubatch-size N``) on Model Runner V1's data-parallel ranks:
the ranks agree to split a step where every rank's batch reaches the threshold; ``UBatchWrapper``
then captures one graph of all the micro-batches per token count under FULL and replays it, and
runs them eagerly under any other mode. The two re-injected bugs of this path (vLLM #25625 and
#43161) are mutants the model tells apart."""

from __future__ import annotations

import pytest

from contract.core.events import START_UP, ExecuteModel, Peer
from contract.core.modes import FULL, FULL_AND_PIECEWISE, NONE, PIECEWISE, CUDAGraphMode
from contract.core.observation import Action, LayerKind
from contract.core.scenario import DrafterKind, Runner, Scenario
from contract.core.trace import run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.runners.mrv1.model import dp_utils
from contract.core.ubatch_utils import UBatching


def _dbo(mode: CUDAGraphMode = FULL_AND_PIECEWISE, **fields) -> Scenario:
    return Scenario(runner=Runner.MRV1, cudagraph_mode=mode, data_parallel_size=2, ubatching=True, **fields)


def _run(scenario: Scenario, policy, *steps: ExecuteModel):
    run, violations = run_events(scenario, policy, [*START_UP, *steps])
    return run.records[-len(steps):], violations


def _ubatch_layer(record):
    [layer] = [a for a in record.dispatches[0].layers if a.kind is LayerKind.UBatchWrapper]
    return layer


def test_decode_batches_on_both_ranks_replay_the_ubatch_wrappers_graph():
    """capture_model captured the 4-token uniform decode in two micro-batches; a decode step whose
    ranks both reach the decode threshold splits and replays it, with no violation."""
    policy = load_policy("vllm_0_30")
    [record], violations = _run(_dbo(), policy, ExecuteModel(4, True, peers=(Peer(3, True),)))
    assert not violations
    d = record.dispatches[0]
    assert (d.runtime_mode, d.batch_descriptor.num_tokens, d.batch_descriptor.num_ubatches) == (FULL, 4, 2)
    assert _ubatch_layer(record).action is Action.REPLAYED and not d.ran_eager


def test_a_decode_step_the_ranks_do_not_split_runs_eagerly_beside_the_micro_batched_graph():
    """An idle rank's one-token dummy batch is below the threshold: the ranks agree not to split, and
    the FULL dispatch of a count the UBatchWrapper holds a micro-batched graph of runs the model
    eagerly (``gpu_ubatch_wrapper.py:366-375``): a silent eager run, P1."""
    [record], violations = _run(_dbo(), load_policy("vllm_0_30"), ExecuteModel(3, True, peers=(Peer(0),)))
    d = record.dispatches[0]
    assert (d.runtime_mode, d.batch_descriptor.num_ubatches, d.ran_eager) == (FULL, 1, True)
    assert [v.property for v in violations] == ["P1"]


def test_a_mixed_step_split_under_piecewise_runs_its_micro_batches_eagerly():
    [record], violations = _run(_dbo(), load_policy("vllm_0_30"), ExecuteModel(4, False, peers=(Peer(4),)))
    d = record.dispatches[0]
    assert (d.runtime_mode, d.batch_descriptor.num_ubatches, d.ran_eager) == (PIECEWISE, 2, True)
    assert _ubatch_layer(record).action is Action.PASSED
    assert [v.property for v in violations] == ["P1"]


def test_the_agreement_aborts_where_the_last_micro_batch_would_be_empty():
    u = UBatching(3, 3, 4)
    ranks = (dp_utils.RankBatch(3, 3, True), dp_utils.RankBatch(4, 4, True))
    assert dp_utils.should_ubatch(u, ranks, [4, 4])
    # padded to 8, three micro-batches of 2: the smallest rank's 3 tokens leave the last one empty
    assert not dp_utils.should_ubatch(u, ranks, [4, 8])
    assert not dp_utils.should_ubatch(u, (ranks[0], dp_utils.RankBatch(2, 2, True)), [4, 4])
    assert not dp_utils.should_ubatch(None, ranks, [4, 4])


def test_a_piecewise_step_replaying_the_micro_batched_full_graph_is_killed():
    """vLLM #25625's pre-fix rule (``bugs/dbo-full-graph-for-mixed-batch``): a mixed step of a
    captured count replays the uniform decode's FULL graph."""
    mutant = mutant_policy(BY_NAME["ubatch_replays_any_mode"])
    [record], violations = _run(_dbo(), mutant, ExecuteModel(4, False, peers=(Peer(4),)))
    layer = _ubatch_layer(record)
    assert (layer.action, layer.entry_mode) == (Action.REPLAYED, FULL)
    assert "P5" in {v.property for v in violations}


def test_a_graph_keyed_by_the_first_two_micro_batches_is_captured_again_when_serving():
    """vLLM #43161's pre-fix key (``bugs/ubatch-graph-key-first-two``): with three micro-batches the
    4-token graph is stored under 2, the lookup by 4 misses and the step captures when serving."""
    step = ExecuteModel(4, True, peers=(Peer(3, True),))
    [record], violations = _run(_dbo(ubatch_size=3), load_policy("vllm_0_30"), step)
    assert _ubatch_layer(record).action is Action.REPLAYED and not violations
    [record], violations = _run(_dbo(ubatch_size=3), mutant_policy(BY_NAME["ubatch_key_first_two"]), step)
    assert _ubatch_layer(record).action is Action.CAPTURED
    assert {"P4", "P5"} <= {v.property for v in violations}
    # with two micro-batches the first two are all of them: the same key
    [record], violations = _run(_dbo(), mutant_policy(BY_NAME["ubatch_key_first_two"]), step)
    assert _ubatch_layer(record).action is Action.REPLAYED and not violations


def test_one_rank_never_splits_and_drafters_stay_off_several_ranks():
    run, violations = run_events(Scenario(runner=Runner.MRV1, ubatching=True), load_policy("vllm_0_30"),
                                 [*START_UP, ExecuteModel(4, True)])
    assert all(d.batch_descriptor.num_ubatches == 1 for r in run.records for d in r.dispatches)
    with pytest.raises(ValueError, match="without micro-batching beside one"):
        _dbo(drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)
    assert _dbo(NONE).ubatch_size == 0


@pytest.mark.evidence
def test_a_change_to_the_ubatch_wrapper_is_sent_to_model_runner_v1s_replay(tmp_path):
    """0.33.0 holds both runners and defaults to V2, whose replay never imports ``UBatchWrapper``: the
    command ``verify --vllm-src`` and the plugin give for a change to it (here, dropping the rule that
    runs a count with a micro-batched graph eagerly) names Model Runner V1's replay."""
    from vllm_envs import edited_tree

    from contract.branch import base as base_mod
    from contract.branch.review import review
    from contract.branch.tree import load
    from contract.families import FAMILIES, by_runner

    tree = edited_tree(tmp_path, "0.33.0", "v1/worker/gpu_ubatch_wrapper.py",
                       "if batch_descriptor.num_tokens in self.cudagraphs:", "if False:")
    branch = load(tree)
    chosen = base_mod.resolve(base_mod.check("0.33.0"), branch.policy, branch)
    assert branch.policy.runner is Runner.MRV2
    assert review(branch, chosen, by_runner(Runner.MRV2)).conform_command(FAMILIES) == \
        f"cudagraph-contract conform --vllm-src {tree} --base 0.33.0 --runner mrv1"
