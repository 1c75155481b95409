"""The generated vLLM-style tests and the affected-release matrix they follow.

Each report counterexample becomes a pytest file (``contract/evidence/vllm_test.py``); run in each
installed release's venv, it must fail where the matrix says *affected* and pass where it says
*fixed*. vLLM 0.29.0's P3 is the positive control: the bug #56312 fixed fails on 0.29.0 and passes
on 0.30.0. Without the venvs the real runs skip, or fail when ``CONTRACT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import ast
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from contract.evidence import matrix
from contract.evidence.vllm_test import CHECKS, file_name, vllm_test
from contract.core.scenario import Runner
from contract.core.trace import load
from vllm_envs import require, run_env

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = matrix.load_conformance(ROOT / "reports" / "conformance")
INSTALLED = ("0.29.0", "0.30.0")
TRACES = [load(p) for p in sorted((ROOT / "reports").glob("*/P*.json"))]
MRV1 = [t for t in TRACES if t.scenario.runner is Runner.MRV1 and t.property in CHECKS]


def expected(trace, release: str) -> str | None:
    state = matrix.cell(trace, release, CONFORMANCE).state
    return {matrix.AFFECTED: "failed", matrix.FIXED: "passed"}.get(state)


def test_generated_files_are_python_with_the_trace():
    for trace in MRV1:
        source = vllm_test(trace, "x")
        ast.parse(source)
        assert repr(trace.scenario.to_json()["cudagraph_mode"]) in source
        assert f"def test_{trace.policy}_{trace.property.lower()}(" in source


def test_p6_gets_no_test():
    trace = load(ROOT / "reports" / "vllm_0_29" / "P3.json")
    trace.property = "P6"
    with pytest.raises(ValueError, match="P6"):
        vllm_test(trace, "x")


def test_matrix_reads_the_replay_and_the_model():
    p3 = load(ROOT / "reports" / "vllm_0_29" / "P3.json")
    fake = {("0.29.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed", "steps": 3, "agreeing": 2}]},
            ("0.30.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed", "steps": 3, "agreeing": 3}]},
            ("0.33.0", Runner.MRV2): {"traces": [{"name": p3.name, "status": "replayed", "steps": 3, "agreeing": 3}]}}
    states = {c.release: c.state for c in matrix.row(p3, fake)}
    assert states["0.29.0"] == matrix.REFUTED  # one step disagrees
    assert states["0.30.0"] == matrix.FIXED
    assert states["0.33.0"] == matrix.NOT_RUN  # that release's replay is of the other runner
    assert states["0.34.0"] == matrix.NOT_APPLICABLE
    # the committed replays: the bug #56312 fixed
    assert matrix.cell(p3, "0.29.0", CONFORMANCE).state == matrix.AFFECTED
    assert matrix.cell(p3, "0.30.0", CONFORMANCE).state == matrix.FIXED


@pytest.mark.conformance
@pytest.mark.parametrize("release", INSTALLED)
def test_generated_tests_fail_where_affected_and_pass_where_fixed(release, tmp_path):
    python = require(release) / "bin" / "python"
    want = {}
    for trace in MRV1:
        outcome = expected(trace, release)
        if outcome is not None:
            (tmp_path / file_name(trace)).write_text(vllm_test(trace, "see the matrix"))
            want[file_name(trace)] = outcome
    assert want, "no counterexample has a replayed cell on this release"
    report = tmp_path / "junit.xml"
    subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", str(tmp_path)],
                   env=run_env(),
                   cwd=tmp_path, capture_output=True, text=True, timeout=900)
    got = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("classname").rsplit(".", 1)[-1] + ".py"
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        got[name] = "skipped" if skipped else "failed" if failed else "passed"
    assert got == want
    if release == "0.29.0":
        assert got["test_cudagraph_contract_vllm_0_29_p3.py"] == "failed"  # the bug #56312 fixed
    else:
        assert got["test_cudagraph_contract_vllm_0_29_p3.py"] == "passed"


def test_conformance_all_covers_the_matrix_releases():
    makefile = (ROOT / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("ALL_VLLM_VERSIONS :="))
    assert tuple(line.split(":=")[1].split()) == matrix.RELEASES
