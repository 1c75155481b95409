"""The corpus of real vLLM bugs (``bugs/``) and the recall the tool measures on it
(``reports/bugs.md``, ``cudagraph-contract bugs``).

``make test`` reads every bug, applies every patch to its release's source (a dry run), renders the
report from the recorded outcomes and compares it with the committed one, and replays the witness of
the found Model Runner V2 bug on its re-injected tree: the class must still be new. ``make evidence``
runs the whole corpus (``bugs --check``, a bug per test): every outcome must be the recorded one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contract.branch import bugs
from contract.branch.fixcheck import patched_copy
from contract.reports import bugs as report
from vllm_envs import installed, release_source

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "bugs"
RECORDED = ROOT / "reports" / "bugs.json"


def corpus() -> list[bugs.Bug]:
    return bugs.corpus(CORPUS)


def recorded() -> dict[str, bugs.Outcome]:
    return {o["bug"]: bugs.Outcome.from_json(o) for o in json.loads(RECORDED.read_text())["outcomes"]}


def test_the_corpus_holds_twenty_real_bugs_each_with_its_upstream_and_its_outcome():
    found = corpus()
    assert len(found) >= 20
    outcomes = recorded()
    assert {b.id for b in found} == set(outcomes)
    for b in found:
        assert b.issues or b.prs
        assert b.faithful, f"{b.id}: why its edit is faithful (or why there is none) is not said"
        shown = outcomes[b.id].status == bugs.IN_RELEASE and outcomes[b.id].classes
        if outcomes[b.id].status not in (bugs.FOUND, bugs.NOT_REINJECTABLE) and not shown:
            assert b.missing, f"{b.id} is missed: what the tool lacks to find it is not said"
        if outcomes[b.id].status == bugs.FOUND or shown:
            assert b.match, f"{b.id}: which class is its mechanism is not judged"


@pytest.mark.parametrize("bug", [b for b in bugs.corpus(CORPUS) if b.patch], ids=lambda b: b.id)
def test_every_patch_applies_to_its_release(bug, tmp_path):
    source = installed(bug.release) if bug.release == "0.34.0" else release_source(bug.release)
    done = subprocess.run(["patch", "-p1", "--dry-run", "-s", "-i", str(bug.patch)], cwd=source.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_committed_report_is_what_the_recorded_outcomes_render():
    every = corpus()
    outcomes = recorded()
    assert (ROOT / "reports" / "bugs.md").read_text() == report.markdown(every, outcomes)
    for b in every:
        assert (b.folder / "README.md").read_text() == report.readme(b, outcomes[b.id]), b.id


def test_every_found_bug_has_its_witness():
    outcomes = recorded()
    for b in corpus():
        assert (b.folder / "witness.json").is_file() == (outcomes[b.id].status == bugs.FOUND), b.id


def cli(*args, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contract.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=1800)


@pytest.mark.conformance
def test_the_found_mrv2_bug_still_shows_its_class_on_its_witness(tmp_path):
    """The regression test of the tool a found bug becomes: its re-injected tree, its witness, the
    class recorded (the whole corpus is make evidence's)."""
    bug = next(b for b in corpus() if recorded()[b.id].status == bugs.FOUND and b.runner == "mrv2")
    tree = patched_copy(installed(bug.release), bug.patch, tmp_path / "tree")
    done = cli("conform", "--vllm-src", tree, "--base", bug.release, "--traces", bug.folder / "witness.json",
               "--reports", tmp_path / "r", env={"CUDAGRAPH_CONTRACT_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1, done.stdout + done.stderr
    new = [line.split(" — witness")[0].removeprefix("  new: ").split("] ", 1)[1]
           for line in done.stdout.splitlines() if line.startswith("  new: ")]
    witness = json.loads((bug.folder / "witness.json").read_text())
    assert any(f"new: {title}" in recorded()[bug.id].classes for title in new), (new, witness["name"])


def test_bad_input_is_one_line(tmp_path):
    done = cli("bugs", "--only", "no-such-bug", "--check")
    assert done.returncode == 2 and done.stderr.startswith("error: --only no-such-bug: no such bug in"), done.stderr
    broken = tmp_path / "corpus" / "broken"
    broken.mkdir(parents=True)
    (broken / "bug.json").write_text("{")
    done = cli("bugs", "--corpus", tmp_path / "corpus", "--reports", tmp_path / "r")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "bug.json cannot be read" in done.stderr and not (tmp_path / "r").exists()


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One cache folder for the run, shared by xdist's workers, so that each release's base side is
    replayed once for all its bugs (the cache writes atomically)."""
    run_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_root = run_root.parent
    return run_root / "bugs-cache"


@pytest.mark.evidence
@pytest.mark.conformance
@pytest.mark.parametrize("bug_id", sorted(p.parent.name for p in CORPUS.glob("*/bug.json")))
def test_every_bug_has_its_recorded_outcome(bug_id, shared_cache):
    """The whole corpus re-injected and replayed, a bug per test: the recall reports/bugs.md gives is
    this commit's."""
    done = cli("bugs", "--check", "--only", bug_id, env={"CUDAGRAPH_CONTRACT_CACHE": str(shared_cache)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_readme_gives_the_recall_the_report_records():
    outcomes = [o for o in recorded().values() if o.status in report.MEASURED]
    found = sum(o.status == bugs.FOUND for o in outcomes)
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"finds {found} of the {len(outcomes)} ({100 * found / len(outcomes):.0f}%)" in text
    unexercised = sum(o.status == bugs.UNEXERCISED for o in outcomes)
    assert f"{unexercised} end in exit 3" in text
    assert f"{sum(o.status == bugs.MISSED for o in outcomes)} pass with exit 0" in text


def test_a_run_reported_elsewhere_leaves_the_corpus_record_alone(tmp_path):
    """Each bug's README renders the record beside the corpus (reports/bugs.json); a run whose
    --reports is another folder writes there only."""
    source = next(b for b in corpus() if b.patch is None and b.release is None)
    corpus_dir = tmp_path / "bugs"
    shutil.copytree(source.folder, corpus_dir / source.id)
    (corpus_dir / source.id / "README.md").write_text("the record\n")
    done = cli("bugs", "--corpus", corpus_dir, "--reports", tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    assert (corpus_dir / source.id / "README.md").read_text() == "the record\n"
    assert (tmp_path / "elsewhere" / "bugs.json").is_file()
    done = cli("bugs", "--corpus", corpus_dir, "--reports", tmp_path / "reports")
    assert done.returncode == 0, done.stderr
    assert "not re-injectable" in (corpus_dir / source.id / "README.md").read_text()
