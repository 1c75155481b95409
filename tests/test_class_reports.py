"""Reports per class and for user branches: one page and one trace per class, the differential
page, a new folder by default and never the committed reports/."""

import json
from pathlib import Path

from typer.testing import CliRunner

from contract.cli import app
from test_classes import NESTED_FULL

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


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
