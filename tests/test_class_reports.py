"""Reports per class and for user branches: one page and one trace per class, the differential
page, a new folder by default and never the committed reports/."""

import json
from pathlib import Path

from typer.testing import CliRunner

from contract.cli import app
from test_classes import NESTED_FULL

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_every_class_has_a_page_and_a_replayable_trace(tmp_path):
    out = tmp_path / "r"
    result = runner.invoke(app, ["report", "--policy", "vllm_0_30", "--out", str(out), "--profile", "ci"])
    assert result.exit_code == 0, result.output
    # the verdict summary, not only where the files went
    assert "verdicts (profile ci;" in result.output
    assert ("vllm_0_30: P0 fails (5 events, 1 class); P1 fails (3 events, 12 classes); P4 fails (5 events, 2 classes); "
            "P7 fails (6 events, 1 class); P10 fails (5 events, 1 class); holds P2 P3 P5 P6") in result.output
    assert "README.md" in result.output
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
        replayed = runner.invoke(app, ["replay", str(page.with_suffix(".json"))])
        assert replayed.exit_code == 0, replayed.output
    # one page per cause: the target's P1 no-capturer pages show different scenarios, not one shown thrice
    target = [p for p in pages if p.name.startswith("P1-target-PIECEWISE-no-capturer--")]
    scenarios = {json.dumps(json.loads(p.with_suffix(".json").read_text())["scenario"], sort_keys=True) for p in target}
    assert len(target) >= 3 and len(scenarios) == len(target)


def test_user_policy_report_goes_to_a_new_folder_with_the_differential(tmp_path, monkeypatch):
    """A new folder under the cache folder's reports/, never the folder it runs from."""
    policy = tmp_path / "nested_full.py"
    policy.write_text(NESTED_FULL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDAGRAPH_CONTRACT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "reports" / "report").mkdir(parents=True)  # an earlier report is left alone
    result = runner.invoke(app, ["report", "--policy", str(policy), "--base", "vllm_0_30", "--profile", "dev", "-q"])
    assert result.exit_code == 1, result.output  # something new
    folder = tmp_path / "cache" / "reports" / "report-2"
    page = (folder / "nested_full" / "differential.md").read_text()
    assert "## New in `nested_full`: " in page and "nested capture" in page
    data = json.loads((folder / "nested_full" / "differential.json").read_text())
    assert data["new"] and data["base"] == "vllm_0_30"
    assert list((folder / "nested_full" / "differential" / "new").glob("*nested-capture*.md"))
    assert not any((tmp_path / "cache" / "reports" / "report").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "nested_full.py"]


def test_user_report_refuses_the_committed_reports_folder(tmp_path):
    before = sorted(p.name for p in (ROOT / "reports").iterdir())
    result = runner.invoke(app, ["report", "--policy", "vllm_0_30", "--out", str(ROOT / "reports"), "-q"])
    assert result.exit_code == 2
    assert "committed reports/" in result.output
    assert sorted(p.name for p in (ROOT / "reports").iterdir()) == before
