"""``fix-check`` on the shipped fixes: for each root cause, the patch for the newest release it patches
gets the verdict ``make fixes`` recorded in its ``fix.json`` (``fix_check``); an accepted one has its
witnesses fixed on vLLM's own code with a graph serving each dispatch they were on, nothing new, no
graph lost, and its vLLM unit test failing before the patch and passing after. A wrong fix (the
drafter made to run eagerly instead of given a capturer) is rejected with that reason, and by its
unit test, though the crash is gone; so is a patch that drops every graph, by every root cause's test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract.real.installed import cache_root
from vllm_envs import per_kind, require, run_env

ROOT = Path(__file__).resolve().parents[1]
FIXES = sorted(p.parent for p in (ROOT / "fixes").glob("*/fix.json"))
# make test checks one accepted fix (MRV2, the newest runner); the rejected wrong fix below (0.33.0) and the
# other shipped verdicts run under -m evidence (make evidence) and are recorded by make fixes.
CHECKED = "mrv2-draft-graphs-under-spec-enforce-eager"


def newest_patch(folder: Path) -> tuple[str, str]:
    patches = json.loads((folder / "fix.json").read_text())["patches"]
    release = max(patches, key=lambda r: tuple(map(int, r.split("."))))
    return release, patches[release]


def fix_check(patch: Path, release: str, folder: Path, reports: Path) -> tuple[int, dict, str]:
    """The verdict, with a home folder of its own: neither the replay nor vLLM's unit test writes there
    (vLLM's cache goes to the tool's cache folder, shared with the other tests as before); and with the
    caller's settings that would change how the unit test runs (``-n 2`` needs a plugin the release's
    environment lacks; optimised bytecode drops asserts), which never reach it."""
    require(release)
    home = reports.parent / "home"
    done = subprocess.run([sys.executable, "-m", "contract.cli", "fix-check", str(patch), "--vllm", release,
                           "--root-cause", str(folder), "--corpus", "witnesses", "--json", "--reports", str(reports)],
                          cwd=ROOT, env=run_env(HOME=str(home), CUDAGRAPH_CONTRACT_CACHE=str(cache_root()),
                                      PYTEST_ADDOPTS="-n 2", PYTHONOPTIMIZE="1"),
                          capture_output=True, text=True, timeout=900)
    assert done.stdout, done.stderr[-2000:]
    assert not home.exists(), sorted(p.relative_to(home) for p in home.rglob("*"))[:5]
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.mark.conformance
@pytest.mark.parametrize("folder", per_kind(FIXES, {f for f in FIXES if f.name == CHECKED}, ids=lambda f: f.name))
def test_the_shipped_fix_gets_its_recorded_verdict(folder, tmp_path):
    release, name = newest_patch(folder)
    recorded = json.loads((folder / "fix.json").read_text()).get("fix_check", {}).get(name)
    assert recorded, f"{folder.name}/fix.json has no fix_check verdict for {name}: run make fixes"
    rc, verdict, stderr = fix_check(folder / name, release, folder, tmp_path / "reports")
    got = "accepted" if verdict["accepted"] else "rejected: " + "; ".join(verdict["reasons"])
    assert got == recorded, stderr[-2000:]
    assert rc == (0 if verdict["accepted"] else 1)
    if verdict["accepted"]:
        checked = "\n".join(verdict["checked"])
        assert f"fail on vLLM {release}, pass with the patch" in checked, checked
        assert "are gone, and a graph serves each dispatch they were on" in checked, checked


def test_make_test_checks_a_shipped_fix():
    assert CHECKED in {f.name for f in FIXES}


def test_every_crash_has_a_fix_accepted_wherever_it_could_be_checked():
    """The most severe root causes (``reports/findings.md``: crashes and hangs first) each have a fix
    that fix-check accepted on every release it patches and replays (``make fixes``)."""
    from contract.evidence.root_causes import load_known
    from contract.reports import root_causes as pages

    views = pages.build(ROOT / "reports" / "conformance", ROOT)
    crashes = [v for v in views if v.cause.severity.label.startswith(("crash", "hang"))]
    assert len(crashes) >= 2 and views[:len(crashes)] == crashes, [v.id for v in views]
    known = {k.id: k for k in load_known(ROOT)}
    for v in crashes:
        assert v.cause.known is not None, v.id
        verdicts = known[v.id].fix_check
        checked = {p: verdicts.get(p, "") for p in known[v.id].patches.values()
                   if not verdicts.get(p, "").startswith("not checked")}
        assert checked and all(x == "accepted" for x in checked.values()), (v.id, verdicts)


@pytest.mark.conformance
@pytest.mark.evidence
def test_a_fix_that_removes_the_graphs_is_rejected(tmp_path):
    folder = ROOT / "fixes" / "mrv1-drafter-capture-after-capture-model"
    wrong = folder / json.loads((folder / "fix.json").read_text())["wrong_fixes"]["0.33.0"]
    rc, verdict, stderr = fix_check(wrong, "0.33.0", folder, tmp_path / "reports")
    assert rc == 1 and not verdict["accepted"], stderr[-2000:]
    assert any("went with the graphs (traded)" in r and "NONE without a graph" in r for r in verdict["reasons"]), \
        verdict["reasons"]
    # the unit test rejects it too: it asserts the breakable drafter keeps its PIECEWISE graphs
    assert "fail with the patch" in "\n".join(verdict["checked"])
    assert any(r.startswith("its unit test does not pass with the patch") for r in verdict["reasons"])


def test_every_root_cause_test_rejected_dropping_every_graph_in_fix_check():
    """``make fixes`` ran fix-check on fixes/drop-every-graph's patch for every release each root cause
    patches and fix-check replays (MRV2 from 0.33.0, MRV1 from 0.30.0); each verdict is a rejection
    by the root cause's own unit test. Every test's rejection on every release is test_upstream's."""
    checked = 0
    for folder in FIXES:
        data = json.loads((folder / "fix.json").read_text())
        for release, name in data["patches"].items():
            if data.get("fix_check", {}).get(name, "").startswith("not checked"):
                continue
            checked += 1
            got = data.get("fix_check", {}).get(f"../drop-every-graph/vllm-{release}.patch", "")
            assert got.startswith("rejected: ") and "its unit test does not pass with the patch" in got, \
                (folder.name, release, got or "not run: make fixes")
    assert checked >= len(FIXES)


@pytest.mark.conformance
@pytest.mark.evidence
def test_dropping_every_graph_gets_its_recorded_verdict(tmp_path):
    folder = ROOT / "fixes" / "mrv2-draft-graphs-under-spec-enforce-eager"
    name = "../drop-every-graph/vllm-0.34.0.patch"
    recorded = json.loads((folder / "fix.json").read_text())["fix_check"][name]
    rc, verdict, stderr = fix_check(folder / name, "0.34.0", folder, tmp_path / "reports")
    assert rc == 1 and "rejected: " + "; ".join(verdict["reasons"]) == recorded, stderr[-2000:]


def test_a_p10_fix_that_captures_nothing_at_the_violating_step_traded_its_graphs():
    """The P10 witness: capture_model captures the drafter's graph memory profiling never estimated. A
    patch after which that step captures no drafter graph (no dispatch at all, as when every mode is
    NONE) mended the estimate by dropping the graph; one that still captures it keeps the graph."""
    from dataclasses import replace

    from contract.branch.fixcheck import ungraphed
    from contract.cli.fixcheck import _violations
    from contract.core.trace import load, run_events
    from contract.families import by_runner, load_policy

    witness = load(ROOT / "tests" / "traces" / "v030-lora-profiling-misses-drafter-graphs.json")
    records = run_events(witness.scenario, load_policy(witness.policy), witness.events)[0].records
    shown = _violations(witness, records, by_runner(witness.scenario.runner), {"property": "P10"})
    assert [(r.index, r.dispatches[v.dispatch].context) for _, r, v in shown] == [(4, "capture_model")]
    assert ungraphed(shown, records) == []
    capture = records[4]
    dropped = [*records[:4], replace(capture, dispatches=[d for d in capture.dispatches if d.role != "drafter"])]
    assert ungraphed(shown, dropped) == [
        "step 4 drafter capture_model: PIECEWISE on the release, no dispatch without a graph with the patch"]
