"""One regeneration of reports/, in a fresh process with another hash seed, checked three ways:
the verdicts are the expected table (every counterexample Hypothesis finds is expected, every
expected one is found and replays), Hypothesis and the explorer agree, and the bytes are the
committed ones. Reports are a function of the seed alone, not of the process that writes them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract.expected import FAILS
from contract.policy import BUILT_IN, load_policy
from contract.properties import PROPERTIES
from contract.trace import loads, replay

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"

# one regeneration for the whole module: under xdist (`--dist loadgroup`) its tests share a worker
pytestmark = pytest.mark.xdist_group("reports")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    # the committed conformance results are inputs of the pages (confirmations)
    for path in sorted((REPORTS / "conformance").glob("*.json")):
        (out / "conformance").mkdir(exist_ok=True)
        (out / "conformance" / path.name).write_bytes(path.read_bytes())
    env = dict(os.environ, PYTHONHASHSEED="4242")
    run = subprocess.run([sys.executable, "-m", "contract.cli", "report", "--profile", "ci", "--out", str(out),
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    return out, json.loads(run.stdout)


@pytest.mark.parametrize("name", BUILT_IN)
def test_verdicts_match_the_expected_table(regenerated, name):
    verdicts = regenerated[1][name]
    assert set(PROPERTIES) <= set(verdicts)
    assert {pid for pid in PROPERTIES if not verdicts[pid]["holds"]} == FAILS[name]
    policy = load_policy(name)
    for pid in FAILS[name]:
        result = replay(loads(json.dumps(verdicts[pid]["trace"])), policy)
        assert result.agrees, result.mismatches
        assert pid in {v.property for v in result.violations}


@pytest.mark.parametrize("name", BUILT_IN)
def test_hypothesis_and_explorer_agree(regenerated, name):
    verdicts = regenerated[1][name]
    for pid in PROPERTIES:
        shortest = verdicts["explorer"][pid]
        assert verdicts[pid]["holds"] == (shortest is None), pid
        if shortest is not None:
            assert shortest <= verdicts[pid]["length"], pid


def test_reports_are_byte_for_byte_current(regenerated):
    out = regenerated[0]
    written = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p.parent.name != "conformance")
    assert written
    stale = [p for p in written if not (REPORTS / p).is_file() or (REPORTS / p).read_bytes() != (out / p).read_bytes()]
    assert not stale, f"reports/ is stale, run `make verify`: {stale}"
