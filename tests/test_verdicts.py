"""The expected verdict table of the built-in policies is a test: every counterexample Hypothesis
finds must be expected, every expected one must be found, and each is a replayable trace."""

import pytest

from contract import profiles
from contract.expected import FAILS
from contract.policy import BUILT_IN, load_policy
from contract.properties import PROPERTIES
from contract.trace import loads, replay
from contract.verify import verify_policy

CI = profiles.get("ci")  # these tests assert what the ci profile finds


@pytest.mark.parametrize("name", BUILT_IN)
def test_verdicts_match_the_expected_table(name):
    policy = load_policy(name)
    verdicts = verify_policy(policy, CI)
    assert set(verdicts) == set(PROPERTIES)
    assert {pid for pid, v in verdicts.items() if not v.holds} == FAILS[name]
    for pid, v in verdicts.items():
        if v.holds:
            continue
        result = replay(loads(v.trace.dumps()), policy)
        assert result.agrees, result.mismatches
        assert pid in {x.property for x in result.violations}
