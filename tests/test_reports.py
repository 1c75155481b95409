"""The committed reports/ are current: regenerating them gives the same bytes, and the verdicts
they hold are the expected table, agreed by Hypothesis and the explorer."""

from pathlib import Path

import pytest

from contract import profiles
from contract.explore import explore
from contract.policy import BUILT_IN, load_policy
from contract.report import PolicyResult, write
from contract.verify import verify_policy

REPORTS = Path(__file__).resolve().parents[1] / "reports"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    results = []
    for name in BUILT_IN:
        policy = load_policy(name)
        cells: set = set()
        verdicts = verify_policy(policy, profiles.get("ci"), cells=cells)
        results.append(PolicyResult(policy, verdicts, explore(policy), cells))
    return out, write(out, results, conformance_reports=REPORTS), results


def test_hypothesis_and_explorer_agree(regenerated):
    for r in regenerated[2]:
        for pid, v in r.verdicts.items():
            assert v.as_expected, (r.policy.name, pid)
            assert v.holds == r.exploration.holds(pid), (r.policy.name, pid)
            if not v.holds:
                assert len(r.exploration.counterexamples[pid].events) <= v.length


def test_reports_are_byte_for_byte_current(regenerated):
    out, written, _ = regenerated
    stale = [p.relative_to(out) for p in written
             if not (REPORTS / p.relative_to(out)).is_file()
             or (REPORTS / p.relative_to(out)).read_bytes() != p.read_bytes()]
    assert not stale, f"reports/ is stale, run `make verify`: {stale}"
