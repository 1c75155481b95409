"""EAGLE's drafter on Model Runner V1's data-parallel ranks: every rank drafts in each step, a busy
rank's ``propose`` and an idle rank's dummy run each syncing the drafter's mode and padded count
across the ranks as the target's are. The ranks must make as many of those syncs per step (vLLM
#26086), and an idle rank's dummy drafter takes a graph beside any graph its target step ran (#30119)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from contract.core.events import START_UP, ExecuteModel, Peer
from contract.core.graphs import coverage
from contract.core.modes import FULL, FULL_AND_PIECEWISE, NONE, PIECEWISE
from contract.core.observation import RankServed
from contract.core.scenario import DrafterKind, Runner, Scenario, Speculator
from contract.core.trace import TraceError, loads, run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.runners.mrv1.model import llm_base_proposer


def _drafting(q: int = 3, mode=FULL_AND_PIECEWISE, **fields) -> Scenario:
    return Scenario(runner=Runner.MRV1, cudagraph_mode=mode, data_parallel_size=2, drafter=DrafterKind.WITH_MODEL,
                    uniform_decode_query_len=q, **fields)


def _step(scenario, policy, event):
    run, violations = run_events(scenario, policy, [*START_UP, event])
    return run.records[-1], violations


def test_every_rank_drafts_and_rank_0_replays_its_draft_graphs_beside_an_idle_rank():
    """Rank 0 decodes one request of 3 tokens (two draft tokens) beside an idle rank: the target
    replays its FULL decode graph, the first draft pass and the remaining ones (one token per request,
    padded to the idle rank's 3) replay PIECEWISE graphs, and nothing is violated."""
    record, violations = _step(_drafting(), load_policy("vllm_0_30"), ExecuteModel(3, True, peers=(Peer(0),)))
    assert not violations and not record.halted
    drafts = [(d.context, d.runtime_mode, d.batch_descriptor.num_tokens) for d in record.dispatches
              if d.role == "drafter"]
    assert drafts == [("propose", PIECEWISE, 3), ("propose_decode", PIECEWISE, 3)]
    assert [r.runtime_mode for r in record.ranks] == [FULL, FULL]
    assert coverage([record]).served == {"target uniform decode": 1, "draft prefill": 1, "draft decode": 1}


def test_one_draft_token_syncs_once_on_every_rank():
    record, violations = _step(_drafting(q=2), load_policy("vllm_0_30"), ExecuteModel(2, True, peers=(Peer(0),)))
    assert not violations
    assert [d.context for d in record.dispatches if d.role == "drafter"] == ["propose"]


def test_a_dummy_run_of_one_forward_leaves_the_ranks_out_of_phase():
    """vLLM #26086's pre-fix dummy run: one forward, one sync, beside a propose of two passes. The
    step stops on every rank at the proposing rank's third sync (the replay's text, a hang: P0, P9),
    after the first draft pass."""
    mutant = mutant_policy(BY_NAME["drafter_dummy_run_one_forward"])
    record, violations = _step(_drafting(), mutant, ExecuteModel(3, True, peers=(Peer(0),)))
    text = "DP ranks out of phase (a hang): rank 0 enters DP sync 3 of the step, rank 1 ends the step after 2"
    assert record.halted == text == llm_base_proposer.out_of_phase([3, 2])
    assert record.ranks == (RankServed.stopped(text), RankServed.stopped(text))
    assert [d.context for d in record.dispatches if d.role == "drafter"] == ["propose"]
    assert {v.property for v in violations} == {"P0", "P9"}
    # two busy ranks both propose twice: in phase
    record, violations = _step(_drafting(), mutant, ExecuteModel(3, True, peers=(Peer(3, True),)))
    assert not violations and not record.halted


def test_the_pre_fix_graph_condition_runs_every_ranks_draft_eagerly_beside_a_full_dummy_step():
    """vLLM #30119's pre-fix condition, ``has_mode(PIECEWISE)``: an idle rank whose dummy step ran
    FULL gives its drafter no graph, and the agreed NONE runs rank 0's draft passes eagerly: graphs
    lost, which no property names (the branch check's lost graphs do)."""
    release = load_policy("vllm_0_30")
    pre_fix = replace(release, drafter_dummy_use_cudagraphs=lambda capturing, mode, spec_eager, loras=0: (
        mode.has_mode(PIECEWISE) and not spec_eager))
    event = ExecuteModel(3, True, peers=(Peer(0),))
    record, violations = _step(_drafting(), pre_fix, event)
    assert not violations
    assert [d.runtime_mode for d in record.dispatches if d.role == "drafter"] == [NONE, NONE]
    assert coverage([record]).served["draft decode"] == 0
    # the same condition beside a PIECEWISE dummy step (FULL_AND_PIECEWISE's mixed mode) changes nothing
    assert llm_base_proposer.dummy_run_use_cudagraphs(False, FULL, False)
    assert not llm_base_proposer.dummy_run_use_cudagraphs(True, FULL, False)
    assert not llm_base_proposer.dummy_run_use_cudagraphs(False, PIECEWISE, True)


@pytest.mark.parametrize("fields, says", [
    ({"speculator": Speculator.STANDALONE_AR}, "modelled with EAGLE's or an n-gram drafter"),
    ({"ubatching": True}, "without micro-batching beside one"),
])
def test_the_draft_models_proposer_and_dbo_beside_a_drafter_are_refused_on_several_ranks(fields, says):
    scenario = {"runner": "MRV1", "data_parallel_size": 2, "drafter": "WITH_MODEL", "uniform_decode_query_len": 2,
                **{k: v.name if hasattr(v, "name") else v for k, v in fields.items()}}
    text = json.dumps({"schema": "cudagraph-contract.trace", "version": 1, "policy": "vllm_0_30",
                       "scenario": scenario, "events": []})
    with pytest.raises(TraceError, match=says):
        loads(text, "t.json")
