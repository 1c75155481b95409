"""P9 on several pipeline stages (``contract/runners/mrv2/model/pp_utils.py``): each stage's own
resolve and dispatch, the hand-over that raises where a stage pads beyond the rows it receives, the
stages' merge on vLLM's own code (one process per stage joined by gloo), and an edited 0.34.0 tree
whose first stage runs eagerly without telling the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.core.classes import RANK_HUNG, Severity, severity, signature
from contract.core.events import START_UP, ExecuteModel
from contract.core.modes import FULL_DECODE_ONLY, AttentionCGSupport
from contract.core.scenario import Runner, Scenario, SplittingOps
from contract.core.trace import TraceError, loads, record_runnable, run_events
from contract.families import load_policy
from contract.real.ranks import merged_stages

ROOT = Path(__file__).resolve().parents[1]
SIZE = "RuntimeError: The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0"
# FULL_DECODE_ONLY without piecewise attention: a NEVER stage resolves NONE, the others keep FULL decode graphs
WEAK = dict(runner=Runner.MRV2, cudagraph_mode=FULL_DECODE_ONLY, splitting_ops=SplittingOps.EMPTY,
            attention_support=AttentionCGSupport.NEVER)
SERVING = [ExecuteModel(4, True), ExecuteModel(3, True)]


def _run(scenario, policy="mrv2_0_34"):
    return run_events(scenario, load_policy(policy), [*START_UP, *SERVING][: 5 + len(SERVING)])


def test_an_eager_first_stage_makes_the_next_raise_in_its_copy_a_hang():
    run, violations = _run(Scenario(**WEAK, pipeline_parallel_size=2, attention_support_stage=0))
    last = run.records[-1]
    assert last.halted == f"PP stage 1: {SIZE}"
    assert [(r.runtime_mode.name, r.num_tokens, r.raised) for r in last.stages] == [("NONE", 3, None),
                                                                                   ("NONE", 0, SIZE)]
    p9 = [v for v in violations if v.property == "P9"]
    assert p9 and "PP stage 1 stopped" in p9[-1].message
    sig = signature(p9[-1], last)
    assert sig.what == RANK_HUNG and severity(sig) is Severity.HANG
    assert {"P0", "P9"} <= {v.property for v in violations}


def test_an_eager_later_stage_is_its_own_resolve_and_breaks_nothing():
    """A weaker later stage resolves NONE and runs eagerly beside graphs, as one rank with that
    backend would (a logged downgrade): it copies the first rows of the padded ones it receives."""
    run, violations = _run(Scenario(**WEAK, pipeline_parallel_size=3, attention_support_stage=2))
    assert run.records[-1].halted is None
    assert [r.runtime_mode.name for r in run.records[-1].stages] == ["FULL", "FULL", "NONE"]
    assert not [v for v in violations if v.property == "P9"]
    _, agreed = _run(Scenario(runner=Runner.MRV2, pipeline_parallel_size=4))
    assert not [v for v in agreed if v.property == "P9"]


def test_a_stage_forced_eager_on_its_own_is_killed():
    from contract.families import MUTANTS, mutant_policy

    mutant = next(m for m in MUTANTS if m.name == "mrv2_pp_first_stage_eager")
    scenario = Scenario(runner=Runner.MRV2, pipeline_parallel_size=2)
    run, violations = run_events(scenario, mutant_policy(mutant), [*START_UP, ExecuteModel(3, True)])
    assert run.records[-1].halted == f"PP stage 1: {SIZE}"
    assert "P9" in {v.property for v in violations}


def test_a_later_stage_that_refuses_its_backend_is_an_accepted_rejection():
    from contract.core.modes import FULL

    scenario = Scenario(runner=Runner.MRV2, cudagraph_mode=FULL, attention_support=AttentionCGSupport.NEVER,
                        pipeline_parallel_size=2, attention_support_stage=1)
    run, violations = run_events(scenario, load_policy("mrv2_0_34"), list(START_UP[:4]))
    assert run.records[-1].halted.startswith("PP stage 1: resolve rejected: CUDAGraphMode.FULL is not supported")
    assert not violations


def test_one_row_sent_is_broadcast_over_the_padding():
    """``copy_`` broadcasts a single received row: a later stage padding 1 token to 2 runs on."""
    from contract.core.modes import FULL_AND_PIECEWISE

    scenario = Scenario(runner=Runner.MRV2, cudagraph_mode=FULL_AND_PIECEWISE, splitting_ops=SplittingOps.EMPTY,
                        attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, pipeline_parallel_size=2,
                        attention_support_stage=0)
    run, _ = run_events(scenario, load_policy("mrv2_0_34"), [*START_UP, ExecuteModel(1), ExecuteModel(3)])
    one, three = run.records[-2], run.records[-1]
    assert one.halted is None and [(r.runtime_mode.name, r.num_tokens) for r in one.stages] == [("NONE", 1),
                                                                                              ("FULL", 2)]
    assert three.halted == f"PP stage 1: {SIZE}"


def test_stages_read_from_json_and_bad_ones_get_one_line():
    scenario = Scenario(**WEAK, pipeline_parallel_size=3, attention_support_stage=1)
    assert Scenario.from_json(scenario.to_json()) == scenario
    assert "pipeline_parallel_size" not in Scenario(runner=Runner.MRV2).to_json()
    head = '{"schema": "cudagraph-contract.trace", "version": 1, "policy": "mrv2_0_34", "events": [], "scenario": '
    for scenario, says in (('{"runner": "MRV2", "pipeline_parallel_size": 5}', "pipeline_parallel_size is 1 to 4"),
                           ('{"runner": "MRV2", "pipeline_parallel_size": 2, "attention_support": "NEVER", '
                            '"attention_support_stage": 2}', "names the stage (0 to pipeline_parallel_size - 1)"),
                           ('{"runner": "MRV2", "pipeline_parallel_size": 2, "drafter": "with_model", '
                            '"uniform_decode_query_len": 2}', "without a drafter and on one DP rank")):
        with pytest.raises(TraceError) as exc:
            loads(head + scenario + "}", "t.json")
        assert says in str(exc.value) and "\n" not in str(exc.value)


def test_the_merge_keeps_the_stages_up_to_the_first_that_stopped():
    start = {"event": {"event": "load_model"}}
    side = {"batch": [3, 3, 1], "runtime_mode": "NONE", "num_tokens": 3}
    serve = {"event": {"event": "execute_model"}, "dispatches": [], "stage": side}
    raised = {"event": {"event": "execute_model"}, "halted": SIZE}
    waiting = {"event": {"event": "execute_model"}, "halted": "RuntimeError: [gloo/transport/tcp] Timed out"}
    out = merged_stages([[start, serve], [start, raised], [start, waiting]])
    assert out == [start, {"event": serve["event"], "dispatches": [], "halted": f"PP stage 1: {SIZE}",
                           "stages": [side, {"raised": SIZE}]}]
    assert merged_stages([[start, serve], [start, serve]])[1]["stages"] == [side, side]
    rejected = {"event": {"event": "resolve"}, "halted": "resolve rejected: CUDAGraphMode.FULL"}
    assert merged_stages([[start, {"event": {"event": "resolve"}}], [start, rejected]])[1] == {
        "event": {"event": "resolve"}, "halted": "PP stage 1: resolve rejected: CUDAGraphMode.FULL"}


FIRST_STAGE_EAGER = ("            need_eager=is_profile or skip_compiled,",
                     "            need_eager=is_profile or skip_compiled or (self.use_pp and self.is_first_pp_rank),")


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_first_stage_runs_eagerly_is_a_new_p9_hang(tmp_path):
    from vllm_envs import conform_tree, edited_tree

    tree = edited_tree(tmp_path, "0.34.0", "v1/worker/gpu/model_runner.py", *FIRST_STAGE_EAGER)
    scenario = Scenario(runner=Runner.MRV2, pipeline_parallel_size=2)
    data = conform_tree(tree, record_runnable(scenario, load_policy("mrv2_0_34"), [*START_UP, *SERVING],
                                              name="two-stages"), tmp_path)
    new = [c for c in data["new"] if c["property"] == "P9"]
    assert new and new[0]["severity"] == "hang" and new[0]["what"] == RANK_HUNG, data["new"]
