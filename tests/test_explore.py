"""The exhaustive explorer agrees with the Hypothesis verdicts: for every built-in policy the same
properties fail (the verdict test pins Hypothesis to the same table), every killable mutant is
killed and every equivalent one is not; shortest counterexamples are never longer than shrunk ones."""

from functools import lru_cache

import pytest

from contract.core.expected import FAILS
from contract.core.modes import AttentionCGSupport
from contract.core.explore import explore
from contract.families import MUTANTS, mutant_policy
from contract.families import BUILT_IN, load_policy
from contract.core.properties import PROPERTIES
from explored import GROUP, explored

pytestmark = GROUP


@lru_cache(maxsize=None)
def canonical(name: str) -> tuple:
    policy = load_policy(name)
    return tuple(policy.engine.canonical_scenarios(policy))


@pytest.mark.parametrize("name", BUILT_IN)
def test_explorer_verdicts_match_the_expected_table(name):
    result = explored(name)
    assert result.complete, "the state graph should reach a fixpoint within the default depth"
    assert {p for p in PROPERTIES if not result.holds(p)} == FAILS[name]
    for prop, trace in result.counterexamples.items():
        assert trace.property == prop and prop in {v["property"] for v in trace.expected_violations}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_explorer_kills_exactly_the_killable_mutants(mutant):
    base = load_policy(mutant.base)
    # where its changed rule acts (several DP ranks, PP stages, breakable graphs): elsewhere the mutant
    # runs its base's steps
    scenarios = ([s for s in canonical(mutant.base) if mutant.reaches(s)]
                 if mutant.reaches else None)
    only = None
    if "P7" in mutant.kills:
        # judged on P7 alone (as test_mutants.py's ci run), where P7 can show: a backend below ALWAYS,
        # LoRA adapters, micro-batched FULL graphs or a hybrid model; the search goes on past scenarios where the
        # mutant only stops vLLM where its base does not (a halt difference) to the first showing P7
        only = frozenset({"P7"})
        scenarios = [s for s in scenarios or canonical(mutant.base)
                     if s.attention_support is not AttentionCGSupport.ALWAYS or s.max_loras or s.micro_batched
                     or s.mamba_cache_blocks is not None]
    result = explore(mutant_policy(mutant), base=base, first_only=True, scenarios=scenarios, only=only)
    assert bool(result.counterexamples) == (not mutant.equivalent)
    assert only is None or "P7" in result.counterexamples, mutant.name


def test_depth_bound_is_reported():
    result = explore(load_policy("vllm_0_30"), depth=3)
    assert not result.complete
    assert "P1" in result.counterexamples  # 3 events: load_model, profile_run, profile_cudagraph_memory
    assert "P4" not in result.counterexamples  # needs 5


@pytest.mark.evidence
@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.reaches], ids=lambda m: m.name)
def test_outside_the_scenarios_it_reaches_a_mutant_runs_as_its_base(mutant):
    """``Mutant.reaches`` lets the kill check above skip scenarios, so it must not hide one where the
    mutant differs: every other scenario explored in lockstep with the base shows none (make
    evidence: the whole bound, as the kill check would without ``reaches``)."""
    outside = [s for s in canonical(mutant.base) if not mutant.reaches(s)]
    result = explore(mutant_policy(mutant), base=load_policy(mutant.base), scenarios=outside, first_only=True)
    assert not result.counterexamples, {p: t.scenario for p, t in result.counterexamples.items()}
