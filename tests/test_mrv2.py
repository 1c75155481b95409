"""Model Runner V2's own rules, per release: manager candidates and dispatch, run_fullgraph's
assertion, memory profiling, speculator managers, and what tells 0.33.0 from 0.34.0."""

from dataclasses import replace
from pathlib import Path

import pytest

from contract.families import for_trace
from contract.core.engine import Run
from contract.core.events import CaptureModel, ExecuteModel, LoadModel, ProfileCudagraphMemory, ProfileRun, Propose, Resolve
from contract.core.modes import FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY, NONE, PIECEWISE, AttentionCGSupport
from contract.runners.mrv2.model import cudagraph_utils as cgu
from contract.runners.mrv2.model.cudagraph_utils import BED
from contract.core.observation import (
    GLOBAL_POOL,
    PRIVATE_POOL,
    THROWAWAY_POOL,
    Action,
    Dispatch,
    LayerAction,
    LayerKind,
    StepRecord,
)
from contract.families import load_policy
from contract.core.properties import accounting, capture_legality, intent
from contract.core.scenario import DrafterKind, Runner, Scenario, Speculator
from contract.core.trace import load, replay

START = [LoadModel(), ProfileRun(), ProfileCudagraphMemory(), Resolve(), CaptureModel()]
TRACES = Path(__file__).parent / "traces"


def _run(policy, events, **fields):
    run = Run(Scenario(runner=Runner.MRV2, **fields), load_policy(policy))
    records = [run.apply(e) for e in events]
    return run, records


def _captured(manager, desc):
    return replace(manager, graphs=manager.graphs | {desc}, graphs_captured=True)


@pytest.mark.parametrize("release", cgu.RELEASES)
def test_first_group_rule_and_decode_tables(release):
    """0.33 tries only the smallest covering FULL group; 0.34 looks a uniform batch up in the
    decode table of its query length first."""
    m = cgu.build("t", release, FULL_AND_PIECEWISE, (2, 4), 2, target_q=2, use_breakable_cg=False)
    m = replace(m, graphs_captured=True)
    assert dict(m.capture_descs)[FULL] == (BED(FULL, 4, 2, 2), BED(FULL, 2, 1, 2))
    assert dict(m.capture_descs)[PIECEWISE] == (BED(PIECEWISE, 4), BED(PIECEWISE, 2))
    assert cgu.dispatch(m, 1, 2, 2, 2) == BED(FULL, 2, 1, 2)
    assert cgu.dispatch(m, 3, 3, None, 3) == BED(PIECEWISE, 4)
    assert cgu.dispatch(m, 4, 5, None, 3) == BED(NONE, 5, 4)
    # two requests of one token each with q=2: not this query length; the token-keyed P graph
    assert cgu.dispatch(m, 2, 2, 1, 1) == BED(PIECEWISE, 2)
    assert cgu.dispatch(replace(m, graphs_captured=False), 1, 2, 2, 2) == BED(NONE, 2, 1)  # _graphs_captured gate


def test_draft_decode_sizes_differ_between_releases():
    q3 = dict(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=3)
    runs = {r: Run(Scenario(**q3), load_policy(r)) for r in ("mrv2_0_33", "mrv2_0_34")}
    decode = {}
    for name, run in runs.items():
        for e in START:
            run.apply(e)
        decode[name] = run.apply(Propose(3, True)).dispatches[-1].batch_descriptor
    # one request drafting one token: 0.33 pads to its smallest shared size, 0.34 has the request grid
    assert decode == {"mrv2_0_33": BED(FULL, 2, 2, 1), "mrv2_0_34": BED(FULL, 1, 1, 1)}


def test_a_0_34_trace_disagrees_on_named_steps_under_0_33():
    trace = load(TRACES / "mrv2-0.34-draft-decode-request-grid.json")
    assert replay(trace, for_trace(trace.policy, "t")).agrees
    result = replay(trace, load_policy("mrv2_0_33"))
    assert "step 6 (propose) differs from the recorded observation" in result.mismatches


@pytest.mark.parametrize("policy", ["mrv2_0_33", "mrv2_0_34"])
def test_run_fullgraph_without_a_graph_is_an_assertion_not_a_capture(policy):
    run, _ = _run(policy, START, cudagraph_mode=FULL_DECODE_ONLY)
    run.state = replace(run.state, target=replace(run.state.target, graphs=frozenset()))
    record = run.apply(ExecuteModel(2, True))
    (d,) = record.dispatches
    assert d.runtime_mode == FULL and [a.action for a in d.layers] == [Action.RAISED]
    assert record.halted.startswith("AssertionError: No cudagraph for BED(FULL,2,2")


@pytest.mark.parametrize("policy, fields", [("mrv2_0_33", {}), ("mrv2_0_33", dict(extensible_kv_cache=False)),
                                            ("mrv2_0_34", dict(extensible_kv_cache=False))])
def test_memory_profiling_captures_then_clears_and_drops_the_managers(policy, fields):
    run, records = _run(policy, START, breakable=True, **fields)
    profiling = records[2]
    assert [(d.runtime_mode, d.layers[0].action) for d in profiling.dispatches] == [
        (PIECEWISE, Action.CAPTURED), (PIECEWISE, Action.CAPTURED), (FULL, Action.CAPTURED), (FULL, Action.CAPTURED)]
    assert "profiling graphs cleared; managers dropped" in profiling.changes
    assert {d.layers[0].pool for d in profiling.dispatches} == {THROWAWAY_POOL}
    # the real capture captures every descriptor again, into fresh managers and runners, in the global pool
    capture = records[4]
    assert all(d.layers[0].action is Action.CAPTURED and not d.previously_captured for d in capture.dispatches)
    assert {d.layers[0].pool for d in capture.dispatches} == {GLOBAL_POOL}
    assert len(capture.dispatches) == 4


def _captured(context: str, pool: str, mode=PIECEWISE) -> Dispatch:
    return Dispatch("target", context, mode, BED(mode, 4),
                    (LayerAction("target:compiled", LayerKind.compiled, PIECEWISE, Action.CAPTURED, pool=pool),),
                    capture_phase=True, capturing_enabled=None, ran_eager=False)


@pytest.mark.parametrize("context, pool, wrong", [
    ("profile_cudagraph_memory", THROWAWAY_POOL, False), ("profile_cudagraph_memory", GLOBAL_POOL, True),
    ("capture_model", GLOBAL_POOL, False), ("capture_model", THROWAWAY_POOL, True), ("capture_model", PRIVATE_POOL, True)])
def test_p10_a_capture_goes_into_the_pool_its_phase_intends(context, pool, wrong):
    record = StepRecord(0, ProfileCudagraphMemory() if context.startswith("profile") else CaptureModel(),
                        (_captured(context, pool),))
    found = [v for v in accounting(Scenario(runner=Runner.MRV2), Runner.MRV2, record)]
    assert bool(found) == wrong and all(" pool: " in v.message for v in found), found


@pytest.mark.parametrize("fields, context, mode, reason", [
    (dict(cudagraph_mode=NONE), "execute_model", PIECEWISE, "under cudagraph_mode NONE"),
    (dict(cudagraph_mode=PIECEWISE), "execute_model", FULL, "does not name"),
    (dict(cudagraph_mode=FULL_DECODE_ONLY), "execute_model", PIECEWISE, None),  # resolve's logged downgrade
    (dict(cudagraph_mode=FULL), "execute_model", PIECEWISE, None),  # resolve's logged upgrade
    (dict(), "profile_run", PIECEWISE, "in profile_run"),
    (dict(), "execute_model", PIECEWISE, None)])
def test_p8_intent_no_graph_where_vllm_means_none(fields, context, mode, reason):
    d = replace(_captured(context, GLOBAL_POOL, mode), capture_phase=False)
    message = intent(Scenario(runner=Runner.MRV2, **fields), Runner.MRV2, d)
    assert (message is None) if reason is None else (reason in message), message


def test_0_34_memory_profiling_returns_first_under_the_extensible_kv_cache():
    """``if self.cache_config.enable_extensible_kv_cache: return 0`` (``34:…/model_runner.py:1123-1125``),
    on by default: no capture and no first resolve, so resolve runs once, from the configured mode."""
    run, records = _run("mrv2_0_34", START, cudagraph_mode=FULL, attention_support=AttentionCGSupport.UNIFORM_BATCH)
    profiling, resolve, capture = records[2], records[3], records[4]
    assert profiling.dispatches == () and profiling.cudagraph_mode == FULL
    assert resolve.changes == ("cudagraph_mode FULL -> FULL_AND_PIECEWISE",)
    assert capture.dispatches and not any(d.previously_captured for d in capture.dispatches)


def test_standalone_ar_has_graphs_only_in_0_34():
    fields = dict(drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2, speculator=Speculator.STANDALONE_AR)
    run33, _ = _run("mrv2_0_33", START, **fields)
    run34, _ = _run("mrv2_0_34", START, **fields)
    assert run33.state.prefill is None and run33.state.decode is None
    assert run34.state.prefill.cudagraph_mode == FULL_AND_PIECEWISE and run34.state.decode.cudagraph_mode == FULL_DECODE_ONLY
    assert all(d.runtime_mode == NONE for d in run33.apply(Propose(2, True)).dispatches)


@pytest.mark.parametrize("speculator, mode", [
    (Speculator.EAGLE, FULL_AND_PIECEWISE),  # the target's resolved mode
    (Speculator.MULTI_MODULE_MTP, FULL_DECODE_ONLY),  # compiled piecewise does not specialise the module
    (Speculator.DFLASH, FULL_DECODE_ONLY),
])
def test_speculator_prefill_manager_modes(speculator, mode):
    run, records = _run("mrv2_0_34", START[:4], drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                        speculator=speculator)
    assert records[3].drafter_cudagraph_mode == mode


def test_dflash_without_uniform_batch_attention_runs_eagerly():
    run, records = _run("mrv2_0_34", START[:4], drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                        speculator=Speculator.DFLASH, attention_support=AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE)
    assert records[3].drafter_cudagraph_mode == NONE


def test_has_compiled_submodule_is_the_model_class_not_the_compilation_mode():
    run, records = _run("mrv2_0_33", START[:4], model_compiled=False)
    assert records[3].cudagraph_mode == FULL_DECODE_ONLY  # piecewise capture unavailable


def test_mrv2_runtime_capture_is_reported_as_silent_not_as_mrv1s_error():
    d = Dispatch("target", "execute_model", PIECEWISE, BED(PIECEWISE, 4),
                 (LayerAction("target:breakable_cg_runner", LayerKind.BreakableCUDAGraphWrapper, None, Action.CAPTURED),),
                 capture_phase=False, capturing_enabled=None, ran_eager=False)
    message = capture_legality(Scenario(runner=Runner.MRV2), Runner.MRV2, d)
    assert "silent runtime capture" in message and "inappropriate" not in message


LEADS = {
    # L1: compiled under FULL, resolved to FULL_AND_PIECEWISE: target PIECEWISE has no capturer
    "L1": (dict(cudagraph_mode=FULL, attention_support=AttentionCGSupport.UNIFORM_BATCH), "target"),
    # L1 again, through adaptive verification's FULL -> FULL_AND_PIECEWISE rewrite
    "L1-adaptive": (dict(cudagraph_mode=FULL, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                         adaptive_verification=True), "target"),
    # L2: a draft model with no active @support_torch_compile submodule under a compiled target
    "L2": (dict(drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2, draft_compiled=False), "drafter"),
}


@pytest.mark.parametrize("policy", ["mrv2_0_33", "mrv2_0_34"])
@pytest.mark.parametrize("lead", sorted(LEADS))
def test_the_explorer_finds_each_lead_on_both_releases(policy, lead):
    from contract.core.explore import explore

    fields, role = LEADS[lead]
    found = explore(load_policy(policy), scenarios=[Scenario(runner=Runner.MRV2, **fields)]).counterexamples
    assert set(found) == {"P1"}
    message = found["P1"].expected_violations[0]["message"]
    assert message.startswith(f"{role} ") and "PIECEWISE" in message and "silent eager fallback" in message
