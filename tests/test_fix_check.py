"""``fix-check`` on the shipped fixes (``fixes/<id>/fix.json`` ``patches``): each root cause's fix for
the newest release it patches is accepted (its witnesses fixed on vLLM's own code, nothing new, no
graph lost, its vLLM unit test failing before the patch and passing after), and a wrong fix (one that
makes the drafter run eager instead of giving it a capturer) is rejected with its reason. The other
releases' patches are checked by ``make fixes``, whose results ``docs/fixes.md`` records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_envs import require, run_env

ROOT = Path(__file__).resolve().parents[1]
FIXES = sorted(p.parent for p in (ROOT / "fixes").glob("*/fix.json"))


def newest_patch(folder: Path) -> tuple[str, Path]:
    patches = json.loads((folder / "fix.json").read_text())["patches"]
    release = max(patches, key=lambda r: tuple(map(int, r.split("."))))
    return release, folder / patches[release]


def fix_check(patch: Path, release: str, reports: Path, *extra: str) -> tuple[int, dict, str]:
    require(release)
    done = subprocess.run([sys.executable, "-m", "contract.cli", "fix-check", str(patch), "--vllm", release,
                           "--corpus", "witnesses", "--json", "--reports", str(reports), *extra],
                          cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=900)
    assert done.stdout, done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout), done.stderr


@pytest.mark.conformance
@pytest.mark.parametrize("folder", FIXES, ids=lambda f: f.name)
def test_the_shipped_fix_is_accepted(folder, tmp_path):
    release, patch = newest_patch(folder)
    rc, verdict, stderr = fix_check(patch, release, tmp_path / "reports")
    assert rc == 0 and verdict["accepted"], (verdict["reasons"], stderr[-2000:])
    checked = "\n".join(verdict["checked"])
    assert f"fail on vLLM {release}, pass with the patch" in checked, checked
    assert "are gone, and a graph serves each dispatch they were on" in checked, checked  # a witness was fixed
    assert (tmp_path / "reports" / "README.md").is_file()


@pytest.mark.conformance
def test_a_fix_that_removes_the_graphs_is_rejected(tmp_path):
    folder = ROOT / "fixes" / "mrv1-drafter-capture-after-capture-model"
    wrong = folder / json.loads((folder / "fix.json").read_text())["wrong_fixes"]["0.33.0"]
    rc, verdict, stderr = fix_check(wrong, "0.33.0", tmp_path / "reports", "--root-cause", str(folder))
    assert rc == 1 and not verdict["accepted"], stderr[-2000:]
    # the unit test passes and the crash is gone: only the graphs the drafter lost tell the fix is wrong
    assert any("went with the graphs (traded)" in r and "NONE without a graph" in r for r in verdict["reasons"]), \
        verdict["reasons"]
    assert "pass with the patch" in "\n".join(verdict["checked"])
