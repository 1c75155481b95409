"""Mutants: the profile kills every non-equivalent one (reporting what the mutant declares), leaves
the equivalent ones alone, and every property is shown to fail on a policy or a mutant."""

import pytest
from hypothesis import Phase, settings

from contract.core import profiles
from contract.core.expected import FAILS
from contract.core.machine import run_machine
from contract.families import BY_NAME, MUTANTS, mutant_policy
from contract.families import load_policy
from contract.core.properties import PROPERTIES

CI = profiles.get("ci")  # these tests assert what the ci profile finds
# A kill needs the ci profile's first counterexample, not its minimal form, which costs five to fifty
# times the search (the shrunk ones are the mutation matrix's, reports/mutation.md): the mutant's
# declared ``kills`` are what the first one may show.
KILL = settings(CI, phases=(Phase.explicit, Phase.reuse, Phase.generate))

KILLABLE = [m for m in MUTANTS if not m.equivalent]
EQUIVALENT = [m for m in MUTANTS if m.equivalent]
# properties no built-in policy violates (and P9 on DP ranks, which none violates there), and the
# mutant that newly violates each
DEMONSTRATED_BY = {"P2": "breakable_acts_on_none", "P5": "entry_key_num_tokens", "P6": "non_recursive_unwrap",
                   "P9": "mrv2_dp_sync_skipped", "P10": "mrv2_profiling_wrapper_pools_not_swapped"}
DEMONSTRATES = {name: prop for prop, name in DEMONSTRATED_BY.items()}


def _run(mutant, settings, only=None):
    return run_machine(mutant_policy(mutant), settings, only=only, base=load_policy(mutant.base))


def test_there_are_enough_mutants():
    assert len(KILLABLE) >= 15
    assert {m.area for m in KILLABLE} >= {"policy", "wrapper", "dispatcher", "resolve", "compile", "capture-window"}


@pytest.mark.parametrize("mutant", KILLABLE, ids=lambda m: m.name)
def test_mutant_is_killed(mutant):
    """A mutant of a shape rule (P7 among what it kills) is judged on P7 alone: the graph of the wrong
    shape or LoRA case is what kills it, where a first-finding run could report P1 the same wrong graph
    also causes; a halt only one side reaches still counts where the mutant declares it (the explorer's
    twin, which must show P7: ``test_explore.py``)."""
    only = frozenset({"P7"}) if "P7" in mutant.kills else None
    found = _run(mutant, KILL, only)
    assert found is not None, f"{mutant.name} survived: {mutant.description}"
    assert found.violation.property in (only or mutant.kills) | (mutant.kills & {"halt"}), found
    assert found.violation.message.startswith(("new violation", "only the mutant stops")) or only is None, found
    if mutant.name in DEMONSTRATES:  # the property no built-in policy violates fails on this mutant
        assert found.violation.property == DEMONSTRATES[mutant.name], found
        assert found.violation.message.startswith("new violation"), found


@pytest.mark.parametrize("mutant", EQUIVALENT, ids=lambda m: m.name)
def test_equivalent_mutant_is_not_reported(mutant):
    assert _run(mutant, CI) is None


def test_every_property_fails_on_a_policy_or_a_mutant():
    assert set().union(*FAILS.values()) | set(DEMONSTRATED_BY) == set(PROPERTIES)


def test_each_property_is_demonstrated_by_a_killable_mutant_that_declares_it():
    """``test_mutant_is_killed`` runs each one and asserts the property is what kills it."""
    for prop, name in DEMONSTRATED_BY.items():
        mutant = BY_NAME[name]
        assert mutant in KILLABLE and prop in mutant.kills and "P7" not in mutant.kills, name
