"""Mutants: the profile kills every non-equivalent one (reporting what the mutant declares), leaves
the equivalent ones alone, and every property is shown to fail on a policy or a mutant."""

import pytest

from contract.core import profiles
from contract.core.expected import FAILS
from contract.core.machine import run_machine
from contract.families import BY_NAME, MUTANTS, mutant_policy
from contract.families import load_policy
from contract.core.properties import PROPERTIES

CI = profiles.get("ci")  # these tests assert what the ci profile finds

KILLABLE = [m for m in MUTANTS if not m.equivalent]
EQUIVALENT = [m for m in MUTANTS if m.equivalent]
# properties no built-in policy violates (and P9 on DP ranks, which none violates there), and the
# mutant that newly violates each
DEMONSTRATED_BY = {"P2": "breakable_acts_on_none", "P5": "entry_key_num_tokens", "P6": "non_recursive_unwrap",
                   "P9": "mrv2_dp_sync_skipped", "P10": "mrv2_profiling_wrapper_pools_not_swapped"}


def _run(mutant, settings, only=None):
    return run_machine(mutant_policy(mutant), settings, only=only, base=load_policy(mutant.base))


def test_there_are_enough_mutants():
    assert len(KILLABLE) >= 15
    assert {m.area for m in KILLABLE} >= {"policy", "wrapper", "dispatcher", "resolve", "compile", "capture-window"}


@pytest.mark.parametrize("mutant", KILLABLE, ids=lambda m: m.name)
def test_mutant_is_killed(mutant):
    """A mutant of a shape rule (P7 among what it kills) is judged on P7 alone: the graph of the wrong
    shape or LoRA case is what kills it, where a first-finding run could report a halt or P1 the same
    wrong graph also causes (the explorer's twin: ``test_explore.py``)."""
    only = frozenset({"P7"}) if "P7" in mutant.kills else None
    found = _run(mutant, CI, only)
    assert found is not None, f"{mutant.name} survived: {mutant.description}"
    assert found.violation.property in (only or mutant.kills), found
    assert found.violation.message.startswith("new violation") or only is None, found


@pytest.mark.parametrize("mutant", EQUIVALENT, ids=lambda m: m.name)
def test_equivalent_mutant_is_not_reported(mutant):
    assert _run(mutant, CI) is None


def test_every_property_fails_on_a_policy_or_a_mutant():
    assert set().union(*FAILS.values()) | set(DEMONSTRATED_BY) == set(PROPERTIES)


@pytest.mark.parametrize("prop", sorted(DEMONSTRATED_BY))
def test_property_fails_on_its_mutant(prop):
    found = _run(BY_NAME[DEMONSTRATED_BY[prop]], CI)
    assert found is not None and found.violation.property == prop
    assert found.violation.message.startswith("new violation")
