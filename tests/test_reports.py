"""One regeneration of reports/, in a fresh process with another hash seed, checked three ways:
the verdicts are the expected table (every counterexample Hypothesis finds is expected, every
expected one is found and replays), Hypothesis and the explorer agree, and the bytes are the
committed ones; each class page has its sections and its trace replays. Reports are a function of
the seed alone, not of the process that writes them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.cli import app
from contract.core.expected import FAILS
from contract.families import BUILT_IN, load_policy
from contract.core.properties import PROPERTIES
from contract.core.trace import loads, replay
from contract.evidence import since

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


def test_every_class_has_a_page_and_a_replayable_trace(regenerated):
    out = regenerated[0]
    pages = sorted((out / "vllm_0_30" / "classes").glob("P1-*.md"))
    assert len(pages) >= 3
    readme = (out / "README.md").read_text()
    for page in pages:
        assert f"vllm_0_30/classes/{page.name}" in readme
        text = page.read_text()
        assert "## The events" in text and "```mermaid" in text and "Smallest settings it occurs under" in text
        # what ran is cited from the replay, or the page says no replay ran; never a fixed list
        assert "## vLLM code on this path" in text and "lines responsible" not in text
        assert ("https://github.com/vllm-project/vllm/blob/v0." in text.split("## vLLM code on this path")[1]
                or "has not been replayed on vLLM's code" in text)
        status = next(line for line in text.splitlines() if line.startswith("- Real-code replay: "))
        assert status.split(": ", 1)[1].startswith(("new: confirmed on vLLM", "known, fixed upstream", "refuted",
                                                      "vLLM stops at this step", "reading: not replayed"))
        replayed = CliRunner().invoke(app, ["replay", str(page.with_suffix(".json"))])
        assert replayed.exit_code == 0, replayed.output
    # one page per cause: the target's P1 no-capturer pages show different scenarios, not one shown thrice
    target = [p for p in pages if p.name.startswith("P1-target-PIECEWISE-no-capturer--")]
    scenarios = {json.dumps(json.loads(p.with_suffix(".json").read_text())["scenario"], sort_keys=True) for p in target}
    assert len(target) >= 3 and len(scenarios) == len(target)


def _package(release: str) -> Path | None:
    """The release's ``vllm`` source: its environment, or ``$CONTRACT_VLLM_SOURCES/<release>/vllm``."""
    found = since.sources(ROOT).get(release)
    if found is None and os.environ.get("CONTRACT_REQUIRE_VLLM") == "1":
        pytest.fail(f"no source for vLLM {release}: make .venv-vllm-{release}/.complete or set {since.ENV}")
    return found


def test_pages_cite_only_lines_that_ran_at_the_replayed_release(regenerated):
    """Each page's code-path section links only releases its witness was replayed on, at that
    release's tag, and each range is a function (or statements of the method named) in that
    release's installed source; a page whose witness no replay ran cites no lines."""
    from contract.evidence import matrix
    from contract.core.trace import load
    from test_decision_lines import LINK, SECTION, check_permalinks

    out = regenerated[0]
    conformance = matrix.load_conformance(REPORTS / "conformance")
    pages = sorted(p for p in out.rglob("*.md") if p.with_suffix(".json").is_file() and p.parent.name != "conformance")
    assert pages
    with_paths = {}
    for (release, runner), data in conformance.items():
        for t in data.get("traces", []):
            if t.get("decision_path"):
                with_paths.setdefault((runner, t.get("name")), set()).add(release)
    packages = {}
    cited = 0
    for page in pages:
        text = page.read_text()
        assert SECTION in text and "lines responsible" not in text, page
        section = text.split(SECTION, 1)[1]
        trace = load(page.with_suffix(".json"))
        replayed = with_paths.get((trace.scenario.runner, trace.name), set())
        linked = {m.group(2) for m in LINK.finditer(section)}
        assert linked <= replayed, (page, linked, replayed)
        if not replayed:
            assert not linked and ".py:" not in section, page
        for release in linked:
            packages.setdefault(release, _package(release))
        usable = {r: p for r, p in packages.items() if p is not None}
        if linked and linked <= set(usable):
            cited += check_permalinks(text, usable)
    # the committed conformance runs record paths, so some page cites lines
    if any(t.get("decision_path") for data in conformance.values() for t in data.get("traces", [])):
        assert cited
