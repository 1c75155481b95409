"""Long fuzzing campaigns run on existing tools: each built-in policy's machine, checking the
properties it is expected to hold, is a plain unittest ``TestCase`` that pytest-xdist spreads over
cores and HypoFuzz can drive:

    .venv/bin/python -m pytest -n 16 --hypothesis-profile=thorough tests/test_fuzz.py
    hypothesis fuzz -- tests/test_fuzz.py        # with `pip install hypofuzz`

``make test`` leaves them out (``-m "not campaign"``): under the ci profile their run is the one
``tests/test_reports.py`` makes when it regenerates the reports, whose verdicts must equal the
expected table, so a holding property found failing fails there.

    .venv/bin/python -m pytest -m campaign --hypothesis-profile=thorough -n 2 tests/test_fuzz.py
"""

import pytest

from contract.core.expected import FAILS
from contract.core.machine import make_machine
from contract.families import load_policy
from contract.core.properties import PROPERTIES


pytestmark = pytest.mark.campaign


def _holding(name: str):
    machine = make_machine(load_policy(name), only=frozenset(PROPERTIES) - FAILS[name])
    return machine.TestCase


TestVllm029Holds = _holding("vllm_0_29")
TestPr56312DraftHolds = _holding("pr56312_draft")
TestVllm030Holds = _holding("vllm_0_30")
TestMrv2_033Holds = _holding("mrv2_0_33")
TestMrv2_034Holds = _holding("mrv2_0_34")
