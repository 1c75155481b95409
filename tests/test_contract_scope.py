"""The contract beyond "exactly one capturer": P0 liveness (vLLM does not stop on a configuration
its validation accepted), P7 shape legality (a FULL graph only for batches the attention backend
can replay), graph coverage and lost graphs in a differential, and a severity on every class."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import lru_cache

import pytest
from typer.testing import CliRunner

from contract.cli import app
from contract.core import halts
from contract.core.classes import Severity
from contract.core.differential import LOST, compare
from contract.core.engine import Run
from contract.core.events import LoadModel
from contract.core.explore import DEFAULT_DEPTH, explore
from contract.core.graphs import KINDS, lost_kinds, model_coverage, run_script
from contract.core.modes import FULL, NONE, AttentionCGSupport as S, CUDAGraphMode
from contract.core.properties import allows, check
from contract.core.scenario import ConfigRejected, DrafterKind, Runner, Scenario
from contract.families import BUILT_IN, MUTANTS, load_policy
from explored import GROUP, explored

pytestmark = GROUP

runner = CliRunner()
AV = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
              adaptive_verification=True)


def stops(scenario, policy_name):
    """(event, halted text, violated properties) of the step where the serving script stops."""
    records = run_script(scenario, load_policy(policy_name))
    for r in records:
        if r.halted:
            return r.event.kind, r.halted, {v.property for v in check(r, scenario, scenario.runner)}
    return None


# -- P0 -------------------------------------------------------------------------------------------

def test_a_stop_is_a_rejection_only_when_validation_refuses_with_advice():
    assert halts.kind("resolve rejected: CUDAGraphMode.FULL is not supported (support: NEVER)") is halts.HaltKind.REJECTED
    assert halts.kind("config rejected: Adaptive verification requires full CUDA graphs") is halts.HaltKind.REJECTED
    assert halts.kind(halts.ADAPTIVE_REJECTED + "x") is halts.HaltKind.REJECTED
    for crash in ("AssertionError", halts.CAPTURE_GUARD_ERROR, halts.ADAPTIVE_PROFILE_ERROR):
        assert halts.kind(crash) is halts.HaltKind.CRASH
    assert (halts.phase("propose"), halts.phase("execute_model"), halts.phase("capture_model")) == \
        ("serving", "serving", "start-up")


def test_the_config_assertions_are_crashes_at_start_up_not_rejections():
    """VllmConfig's piecewise assert and the CudagraphDispatcher constructor's are AssertionErrors:
    if a setting reached them, vLLM would stop after accepting it (P0), at the first step."""
    def normalise(scenario, revision):
        raise ConfigRejected("Compilation mode should be CompilationMode.VLLM_COMPILE when cudagraph_mode piecewise "
                             "cudagraphs is used", assertion=True)

    for base, field in (("vllm_0_30", "normalise"), ("mrv2_0_34", "post_init")):
        policy = load_policy(base).mutate("asserting", "", **{field: normalise})
        scenario = Scenario(runner=policy.runner)
        run = Run(scenario, policy)
        record = run.apply(LoadModel())
        assert record.halted.startswith("AssertionError: Compilation mode should be")
        assert [v.property for v in check(record, scenario, policy.runner)] == ["P0"]
    rejected = ConfigRejected("Adaptive verification requires full CUDA graphs")
    assert rejected.halted.startswith("config rejected: ")


def test_the_capture_guard_stop_is_p4_and_p0_when_serving():
    classes = {c.signature.property: c for c in explored("vllm_0_30").classes if c.signature.role == "drafter"
               and c.signature.runtime_mode == "PIECEWISE" and c.signature.property in ("P0", "P4")}
    assert set(classes) == {"P0", "P4"}
    p0 = classes["P0"]
    assert p0.signature.what == "vLLM stops when serving" and "inappropriate time" in p0.signature.detail
    assert p0.severity is Severity.CRASH_SERVING and classes["P4"].severity is Severity.CRASH_SERVING
    assert p0.where == "breakable on + cudagraph_mode FULL + drafter WITH_MODEL"
    assert p0.witness.events[-1].kind == "propose"


@pytest.mark.parametrize("policy,extensible,where", [("mrv2_0_33", True, "profile_cudagraph_memory"),
                                                      ("mrv2_0_34", False, "profile_cudagraph_memory"),
                                                      ("mrv2_0_34", True, "resolve")])
@pytest.mark.parametrize("support", [S.NEVER, S.UNIFORM_SINGLE_TOKEN_DECODE, S.UNIFORM_BATCH])
def test_a_weak_target_backend_under_adaptive_verification_is_an_accepted_rejection(policy, extensible, where,
                                                                                    support):
    """maybe_create_adaptive_verification_manager refuses it with a ValueError before the rewrite, in
    whichever initialize_kv_cache comes first (0.34.0's default extensible KV cache skips profiling's)."""
    event, halted, violated = stops(replace(AV, attention_support=support, extensible_kv_cache=extensible), policy)
    assert event == where
    assert halted == f"{halts.ADAPTIVE_REJECTED}query lengths vary up to 2, but a {support.name} backend allows none"
    assert not violated


@pytest.mark.parametrize("policy", ["mrv2_0_33", "mrv2_0_34"])
def test_a_declared_varlen_bound_passes_the_check(policy):
    scenario = replace(AV, attention_support=S.UNIFORM_BATCH, varlen_decode_bound=True)
    assert stops(scenario, policy) is None
    records = run_script(scenario, load_policy(policy))
    varlen = [d for r in records for d in r.dispatches if getattr(d.batch_descriptor, "max_query_len", None) == 2
              and d.runtime_mode == FULL and d.role == "target"]
    assert varlen and not [v for r in records for v in check(r, scenario, Runner.MRV2)]


@pytest.mark.parametrize("policy,extensible,where,halted", [
    ("mrv2_0_33", True, "resolve", "AssertionError"),
    ("mrv2_0_34", False, "resolve", "AssertionError"),
    ("mrv2_0_34", True, "capture_model", halts.ADAPTIVE_PROFILE_ERROR),
])
@pytest.mark.parametrize("support", [S.NEVER, S.UNIFORM_SINGLE_TOKEN_DECODE])
def test_a_weak_draft_only_backend_stops_vllm_at_start_up(policy, extensible, where, halted, support):
    """The check reads the target's layers only; resolve's minimum includes the draft's, lowers the
    mode to PIECEWISE and writes it back: the second initialize_kv_cache asserts on it, or (one
    initialize_kv_cache) capture_model has no FULL graph to profile and set_cost_curves raises."""
    scenario = replace(AV, attention_support=support, attention_support_draft_only=True,
                       extensible_kv_cache=extensible)
    assert stops(scenario, policy) == (where, halted, {"P0"})


PP_COPY = "PP stage N: RuntimeError: The size of tensor a (N) must match the size of tensor b (N) at non-singleton " \
          "dimension N"


def test_p0_classes_of_the_mrv2_releases():
    """Adaptive verification's start-up stops, and a later pipeline stage's copy of the rows an
    eager stage sent (``tests/test_stages.py``)."""
    for name in ("mrv2_0_33", "mrv2_0_34"):
        p0 = explored(name).classes_of("P0")
        assert {c.signature.detail for c in p0} == {"AssertionError", halts.ADAPTIVE_PROFILE_ERROR, PP_COPY}
        for c in p0:
            if c.signature.detail == PP_COPY:
                assert c.severity is Severity.CRASH_SERVING and "pipeline_parallel_size 2" in c.where
            else:
                assert c.severity is Severity.CRASH_START_UP and "that support on the draft layers only on" in c.where


@pytest.mark.parametrize("name", BUILT_IN)
def test_accepted_rejections_are_listed_not_classes(name):
    ex = explored(name)
    assert not [c for c in ex.classes if c.signature.property in ("halt", "rejected")]
    details = {c.signature.detail for c in ex.rejections}
    assert "resolve rejected: CUDAGraphMode.FULL is not supported (support: NEVER)" in details
    for c in ex.rejections:
        assert halts.kind(c.message) is halts.HaltKind.REJECTED
        assert halts.reason(c.message) != "a ValueError with advice from vLLM's start-up validation"
    if name.startswith("mrv2"):
        assert any(d.startswith(halts.ADAPTIVE_REJECTED) for d in details)
        assert "config rejected: Adaptive verification requires full CUDA graphs" in details


# -- P7 -------------------------------------------------------------------------------------------

def test_the_support_levels_allow_what_vllm_documents():
    uniform1, uniform2, varlen, anything = ("uniform", 1), ("uniform", 2), ("varlen", 2), ("any", None)
    table = {S.ALWAYS: (True, True, True, True), S.UNIFORM_BATCH: (True, True, False, False),
             S.UNIFORM_SINGLE_TOKEN_DECODE: (True, False, False, False), S.NEVER: (False, False, False, False)}
    for support, want in table.items():
        assert tuple(allows(support, b, False) for b in (uniform1, uniform2, varlen, anything)) == want
    assert allows(S.UNIFORM_BATCH, varlen, True) and allows(S.UNIFORM_SINGLE_TOKEN_DECODE, varlen, True)
    assert not allows(S.NEVER, varlen, True)


def test_0_34_draft_prefill_takes_varlen_graphs_a_draft_only_backend_cannot_replay():
    p7 = explored("mrv2_0_34").classes_of("P7")
    assert len(p7) == 1
    c = p7[0]
    assert (c.signature.role, c.signature.runtime_mode) == ("drafter", "FULL") and c.severity is Severity.UNSUPPORTED_SHAPE
    assert c.where == ("drafter WITH_MODEL + attention support UNIFORM_BATCH + adaptive_verification on + "
                       "that support on the draft layers only on")
    assert "decode batches of 1..2 tokens per request" in c.message
    # 0.33.0's draft prefill has no varlen graphs; with a declared bound 0.34.0's are legal too
    assert explored("mrv2_0_33").holds("P7")
    bounded = replace(c.witness.scenario, varlen_decode_bound=True)
    assert not [v for r in run_script(bounded, load_policy("mrv2_0_34")) for v in check(r, bounded, Runner.MRV2)
                if v.property == "P7"]


P7_MUTANTS = [m for m in MUTANTS if "P7" in m.kills]


def test_there_are_p7_mutants_in_both_families():
    """Each is judged on P7 alone by ``ci`` (``test_mutants.py``, where a halt the mutant declares may
    come first) and killed on P7 by the explorer (``test_explore.py``)."""
    assert {m.base.startswith("mrv2") for m in P7_MUTANTS} == {True, False} and len(P7_MUTANTS) >= 3


# -- graph coverage, lost graphs, traded ---------------------------------------------------------

def _no_upgrade(mode, config, support, q, v2, sizes, available=True):
    """resolve without the FULL -> FULL_AND_PIECEWISE upgrade: FULL_DECODE_ONLY instead."""
    from contract.core import resolve

    if mode == FULL and support is not S.ALWAYS and support is not S.NEVER:
        mode = CUDAGraphMode.FULL_DECODE_ONLY
    return resolve.resolve_cudagraph_mode_and_sizes(mode, config, support, q, v2, sizes, available)


def _no_graphs(mode, config, support, q, v2, sizes, available=True):
    from contract.core import resolve

    resolve.resolve_cudagraph_mode_and_sizes(mode, config, support, q, v2, sizes, available)  # its rejections
    return resolve.Resolved(NONE, sizes)


def branch_of(kind: str):
    return load_policy("mrv2_0_33").mutate(f"mrv2_{kind}", kind,
                                           resolve={"no_upgrade": _no_upgrade, "no_graphs": _no_graphs}[kind])


@lru_cache(maxsize=None)
def _explored_branch(kind: str):
    return explore(branch_of(kind), classify=True)


def _shared_explore(policy, depth=DEFAULT_DEPTH, *args, classify=False, **kwargs):
    """``explore`` for the command-line test: the default-depth classified exploration of a built-in
    policy or a branch above is the module's own (the command's exit and output are what it checks)."""
    if classify and depth == DEFAULT_DEPTH and not args and not kwargs:
        if policy.name in BUILT_IN:
            return explored(policy.name)
        if policy.name.startswith("mrv2_no_"):
            return _explored_branch(policy.name.removeprefix("mrv2_"))
    return explore(policy, depth, *args, classify=classify, **kwargs)


@lru_cache(maxsize=None)
def differential(kind: str):
    return compare(branch_of(kind), load_policy("mrv2_0_33"), branch_exploration=_explored_branch(kind),
                   base_exploration=explored("mrv2_0_33"))


def test_coverage_counts_serving_dispatches_by_kind():
    scenario = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2)
    cov = model_coverage(scenario, load_policy("mrv2_0_34"))
    # every batch up to the largest capture size (4) is served; 5 tokens run eagerly by design
    assert cov.kinds() == {"target mixed": (4, 5), "target uniform decode": (2, 2), "draft prefill": (4, 5)}
    assert cov.graphs == 10 and cov.dispatches == 12
    eager = model_coverage(replace(scenario, cudagraph_mode=NONE), load_policy("mrv2_0_34"))
    assert eager.graphs == 0 and eager.dispatches == cov.dispatches
    assert tuple(KINDS) == ("target mixed", "target uniform decode", "draft prefill", "draft decode")


def test_removing_the_upgrade_loses_graphs():
    d = differential("no_upgrade")
    assert d.lost and all(c.signature.property == LOST for c in d.lost)
    mixed = [c for c in d.lost if c.signature.what == "fewer target mixed dispatches served by a graph"]
    assert mixed and "cudagraph_mode FULL" in mixed[0].where
    assert mixed[0].witness.scenario.breakable  # the breakable runner served them under FULL_AND_PIECEWISE
    # and on pipeline stages the weak stage now runs a mixed batch eagerly that an ALWAYS stage pads
    # for its FULL graph: the copy of the weak stage's rows raises
    assert {c.signature.property for c in d.new} == {"P0", "P9"} and all("pipeline_parallel_size 2" in c.where
                                                                            for c in d.new)
    assert d.exit_code() == 1 and d.exit_code(allow_lost_graphs=True) == 1
    assert replace(d, new=[]).exit_code(allow_lost_graphs=True) == 0


def test_a_class_gone_with_the_graphs_is_traded_not_fixed():
    """A branch that captures nothing shows none of the base's P1 classes, but where the base served
    batches with graphs they are traded for eager runs, not fixed."""
    d = differential("no_graphs")
    base, branch = load_policy("mrv2_0_33"), branch_of("no_graphs")
    assert d.traded and d.lost
    assert {c.signature.what for c in d.lost} >= {"fewer target mixed dispatches served by a graph",
                                                   "fewer target uniform decode dispatches served by a graph"}
    for c in d.traded:
        s = c.witness.scenario
        assert lost_kinds(model_coverage(s, base), model_coverage(s, branch)), c.title
    for c in d.fixed:
        s = c.witness.scenario
        assert not lost_kinds(model_coverage(s, base), model_coverage(s, branch)), c.title


def test_a_real_fix_is_still_fixed():
    """0.30.0's #56312 stops the match-any breakable wrapper capturing FULL (0.29.0's P3): the
    CUDAGraphWrapper(FULL) serves those batches instead, so no graph is lost and P3 is fixed."""
    d = compare(load_policy("vllm_0_30"), load_policy("vllm_0_29"), branch_exploration=explored("vllm_0_30"),
                base_exploration=explored("vllm_0_29"))
    assert [c.signature.property for c in d.fixed if c.signature.property == "P3"] == ["P3"]
    assert not [c for c in d.traded if c.signature.property == "P3"]


def test_lost_graphs_exit_1_on_the_command_line_unless_allowed(monkeypatch):
    import contract.cli.common as common

    real = common.load_policy

    def load(spec):
        if spec == "mrv2_no_upgrade":
            return branch_of("no_upgrade")
        return real(spec)

    monkeypatch.setattr(common, "load_policy", load)
    monkeypatch.setattr("contract.core.explore.explore", _shared_explore)
    monkeypatch.setattr("contract.core.differential.explore", _shared_explore)
    result = runner.invoke(app, ["explore", "--policy", "mrv2_no_upgrade", "--base", "mrv2_0_33", "--json"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)["mrv2_no_upgrade"]["differential"]
    assert payload["lost_graphs"] and {c["property"] for c in payload["new"]} == {"P0", "P9"} and "traded" in payload
    allowed = runner.invoke(app, ["explore", "--policy", "mrv2_no_upgrade", "--base", "mrv2_0_33",
                                  "--allow-lost-graphs"])
    assert allowed.exit_code == 1, allowed.output  # allowed lost graphs, but a new class
    assert "lost graphs in mrv2_no_upgrade" in allowed.output


# -- severity ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUILT_IN)
def test_every_class_has_a_severity_and_lists_are_worst_first(name):
    classes = explored(name).classes
    ranks = [c.severity.rank for c in classes]
    assert ranks == sorted(ranks)
    for c in classes:
        assert c.to_json()["severity"] == c.severity_text
        if c.severity is Severity.EAGER_FALLBACK:
            assert c.affected is not None and 0 < c.affected <= 1
            assert c.severity_text.endswith("of its scenario's serving dispatches)")


def test_the_drafter_losing_graphs_under_spec_enforce_eager_is_no_loss():
    """speculative_config.enforce_eager asks for an eager drafter: a branch that stops graphing the
    drafter there loses nothing (a fix of P8's class), while the target's graphs still count."""
    from contract.core.differential import lost_occurrence

    base, branch = load_policy("mrv2_0_33"), branch_of("no_graphs")
    lost = {}
    for eager in (False, True):
        s = Scenario(runner=Runner.MRV2, drafter=DrafterKind.WITH_MODEL, uniform_decode_query_len=2,
                     spec_enforce_eager=eager)
        lost[eager] = {sig.role for sig in lost_occurrence(0, s, run_script(s, base), run_script(s, branch), s.runner)}
    assert lost == {False: {"target", "drafter"}, True: {"target"}}
