"""Named regression traces under tests/traces/ replay to exactly what they recorded."""

from pathlib import Path

import pytest

from contract.families import for_trace
from contract.core.trace import load, replay

TRACES = sorted((Path(__file__).parent / "traces").glob("*.json"))


def test_there_are_regression_traces():
    assert len(TRACES) >= 8


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_regression_trace_replays(path):
    trace = load(path)
    result = replay(trace, for_trace(trace.policy, str(path)))
    assert result.agrees, result.mismatches
    shown = {v.property for v in result.violations}
    if trace.property:
        assert trace.property in shown
    else:
        assert not shown
