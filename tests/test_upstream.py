"""The vLLM unit test of every root cause (``fixes/<id>/test_*.py``), as it would run in vLLM's own
``tests/v1/cudagraph/``: imports only vLLM, torch, numpy, pytest and the standard library, carries
vLLM's license header, and, run against every installed release with no path to this project, fails
exactly where its root cause is confirmed, passes where it is not, and skips with a reason where the
code it needs does not exist (``fix.json`` ``expected``)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_envs import installed, per_kind, require, selected

ROOT = Path(__file__).resolve().parents[1]
SHARED = ".venv-vllm"  # the closure the release venvs share, which a patched tree runs on
DROP = ROOT / "fixes" / "drop-every-graph"
RUFF = ROOT / "fixes" / "ruff.toml"  # vLLM's ruff settings
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


def dropped_graphs(release: str, dest: Path) -> Path:
    """The release's ``vllm`` package, hard-linked, with ``fixes/drop-every-graph``'s patch applied:
    resolve turns every mode into NONE, the fix that makes every graph violation go away."""
    package = installed(release)
    shutil.copytree(package, dest / "vllm", copy_function=os.link, ignore=shutil.ignore_patterns("__pycache__"))
    target = dest / "vllm" / "config" / "compilation.py"
    target.unlink()
    shutil.copy2(package / "config" / "compilation.py", target)
    subprocess.run(["patch", "-p1", "-s", "-i", str(DROP / f"vllm-{release}.patch")], cwd=dest, check=True)
    return dest


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, request):
    """Per selected release, two pytest runs over every root cause's test: on the release, and on the
    release with every graph dropped (``dropped_graphs``, on the shared closure); the runs side by
    side, each one process: (release, run) -> (outcomes, output)."""
    started = {}
    for release in [r for r in RELEASES if r in selected(request, "release")]:
        cwd = tmp_path_factory.mktemp(f"upstream-{release}")  # nothing of this project on the path
        env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "VLLM_LOGGING_LEVEL": "ERROR"}
        tree = dropped_graphs(release, tmp_path_factory.mktemp(f"dropped-{release}"))
        for run, python, extra in (("release", require(release) / "bin" / "python", {}),
                                   ("dropped", ROOT / SHARED / "bin" / "python", {"PYTHONPATH": str(tree)})):
            started[(release, run)] = subprocess.Popen(
                [str(python), "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *map(str, TESTS.values())],
                cwd=cwd, env={**env, **extra}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    found = {}
    try:
        for key, proc in started.items():
            out, err = proc.communicate(timeout=1200)
            found[key] = (outcomes(out), out + err)
    finally:
        for proc in started.values():
            proc.kill()
            proc.wait()
    return found


@pytest.mark.conformance
@pytest.mark.xdist_group("upstream")
@pytest.mark.parametrize("release", per_kind(RELEASES, KEPT))
def test_each_root_cause_test_fails_exactly_where_it_is_confirmed(matrix, release):
    got, output = matrix[(release, "release")]
    want = {name: json.loads((ROOT / "fixes" / name / "fix.json").read_text())["expected"].get(release)
            for name in TESTS}
    assert not [n for n, o in got.items() if o in ("error", "missing")], output[-3000:]
    assert got == want, output[-3000:]
    if "skip" in got.values():
        assert re.search(r"SKIPPED \[\d+\] .+: \S", output), "a skip names its reason"


@pytest.mark.conformance
@pytest.mark.xdist_group("upstream")
@pytest.mark.parametrize("release", per_kind(RELEASES, KEPT))
def test_every_root_cause_test_rejects_dropping_every_graph(matrix, release):
    """A fix that drops every graph ends every graph violation; each test must fail on it wherever it
    runs at all, because each also asserts the graphs the configuration keeps."""
    got, output = matrix[(release, "dropped")]
    assert not [n for n, o in got.items() if o in ("error", "missing")], output[-3000:]
    passed = [name for name, outcome in got.items() if outcome == "pass"]
    assert passed == [], output[-3000:]
    assert "fail" in got.values()


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args, "--config", str(RUFF)], capture_output=True,
                          text=True, cwd=ROOT)


def test_root_cause_tests_pass_ruff_with_vllm_settings():
    files = [str(t) for t in TESTS.values()]
    checked, formatted = ruff("check", *files), ruff("format", "--check", *files)
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert formatted.returncode == 0, formatted.stdout[-3000:]


def test_every_test_is_under_a_hundred_lines():
    long = {name: n for name, t in TESTS.items() if (n := len(t.read_text(encoding="utf-8").splitlines())) >= 100}
    assert long == {}


PATCHES = [(folder.name, release, name) for folder in FIXES
           for release, name in sorted(json.loads((folder / "fix.json").read_text())["patches"].items())]


@pytest.mark.parametrize("root_cause,release,name", per_kind(PATCHES, {p for p in PATCHES if p[1] in KEPT}))
def test_patches_add_no_ruff_finding_and_keep_the_format(root_cause, release, name, tmp_path):
    """Each patch, applied to its release's files, adds no finding of vLLM's ruff settings and leaves
    formatted files formatted."""
    package = installed(release).parent
    patch = ROOT / "fixes" / root_cause / name
    files = re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)
    before, after = tmp_path / "a", tmp_path / "b"
    for f in files:
        for side in (before, after):
            (side / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(package / f, side / f)
    subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=after, check=True)

    def findings(side):
        out = ruff("check", "--output-format", "json", "--exit-zero", *[str(side / f) for f in files]).stdout
        return sorted((f["code"], Path(f["filename"]).relative_to(side).as_posix()) for f in json.loads(out))

    assert findings(after) == findings(before)
    for f in files:
        if ruff("format", "--check", str(before / f)).returncode == 0:
            assert ruff("format", "--check", str(after / f)).returncode == 0, f"{f} is not formatted"
