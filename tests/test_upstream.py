"""The vLLM unit test of every root cause (``fixes/<id>/test_*.py``), as it would run in vLLM's own
``tests/v1/cudagraph/``: imports only vLLM, torch, numpy, pytest and the standard library, carries
vLLM's license header, and, run against every installed release with no path to this project, fails
exactly where its root cause is confirmed, passes where it is not, and skips with a reason where the
code it needs does not exist (``fix.json`` ``expected``)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_envs import per_kind, require, selected

ROOT = Path(__file__).resolve().parents[1]
FIXES = sorted(p.parent for p in (ROOT / "fixes").glob("*/fix.json"))
TESTS = {f.name: f / json.loads((f / "fix.json").read_text())["test"] for f in FIXES}
RELEASES = ("0.29.0", "0.30.0", "0.33.0", "0.34.0")
# make test runs the newest release (0.34.0, Model Runner V2); the others are make evidence's, which CI
# runs after make test
KEPT = {"0.34.0"}
ALLOWED = {"vllm", "torch", "numpy", "pytest", "unittest"} | set(sys.stdlib_module_names)
HEADER = ["# SPDX-License-Identifier: Apache-2.0",
          "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project"]


def imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add((node.module or "").split(".")[0])
    return found


@pytest.mark.parametrize("root_cause", list(TESTS))
def test_a_root_cause_test_is_a_vllm_test(root_cause):
    path = TESTS[root_cause]
    assert path.read_text(encoding="utf-8").splitlines()[:2] == HEADER
    assert imported(path) <= ALLOWED, imported(path) - ALLOWED


def outcomes(text: str) -> dict[str, str]:
    """Per root cause folder, its test's outcome in one pytest run's ``-rA`` summary."""
    out = {}
    for name, test in TESTS.items():
        lines = [line for line in text.splitlines()
                 if re.match(r"^(PASSED|FAILED|ERROR|SKIPPED)", line) and f"{name}/{test.name}" in line]
        if any(line.startswith("ERROR") for line in lines):
            out[name] = "error"
        elif any(line.startswith("FAILED") for line in lines):
            out[name] = "fail"
        elif any(line.startswith("PASSED") for line in lines):
            out[name] = "pass"
        else:
            out[name] = "skip" if lines else "missing"
    return out


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, request):
    """One pytest run per selected release over every root cause's test, the releases side by side
    (each run is one process): (outcomes, output)."""
    started = {}
    for release in [r for r in RELEASES if r in selected(request, "release")]:
        python = require(release) / "bin" / "python"
        cwd = tmp_path_factory.mktemp(f"upstream-{release}")  # nothing of this project on the path
        env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "VLLM_LOGGING_LEVEL": "ERROR"}
        started[release] = subprocess.Popen([str(python), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                                             *map(str, TESTS.values())], cwd=cwd, env=env, text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    found = {}
    try:
        for release, proc in started.items():
            out, err = proc.communicate(timeout=1200)
            found[release] = (outcomes(out), out + err)
    finally:
        for proc in started.values():
            proc.kill()
            proc.wait()
    return found


@pytest.mark.conformance
@pytest.mark.xdist_group("upstream")
@pytest.mark.parametrize("release", per_kind(RELEASES, KEPT))
def test_each_root_cause_test_fails_exactly_where_it_is_confirmed(matrix, release):
    got, output = matrix[release]
    want = {name: json.loads((ROOT / "fixes" / name / "fix.json").read_text())["expected"].get(release)
            for name in TESTS}
    assert not [n for n, o in got.items() if o in ("error", "missing")], output[-3000:]
    assert got == want, output[-3000:]
    if "skip" in got.values():
        assert re.search(r"SKIPPED \[\d+\] .+: \S", output), "a skip names its reason"
