"""Every reproduction on a report page, run through its release's own parser and config code on CPU
(``contract.evidence.engine_check``, one child process per release), matches its scenario; the
mutants (a page command with one setting made wrong) are caught; the committed support-by-GPU table
and model compile facts are what the installed release's code says.

Skipped without the release's venv; failed with ``CONTRACT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.evidence import model_facts, reach, repro_check
from contract.evidence.release_facts import adaptive_refused, support_by_capability
from vllm_envs import per_kind, release_source, require

# One worker runs the module, so each release's child process runs once for its four tests.
pytestmark = pytest.mark.xdist_group("engine-check")
ROOT = Path(__file__).resolve().parents[1]
RELEASES = reach.RELEASES
# make test runs vLLM on the newest release (0.34.0, Model Runner V2); the others are make evidence's,
# which CI runs after make test.
RUN = per_kind(RELEASES, {"0.34.0"})
PAGES = repro_check.pages(ROOT / "reports")
_RUNS: dict[str, repro_check.ReleaseRun] = {}


def run(release: str) -> repro_check.ReleaseRun:
    python = require(release) / "bin" / "python"
    if release not in _RUNS:
        _RUNS[release] = repro_check.run_release(release, python, [p for p in PAGES if p.release == release])
    return _RUNS[release]


@pytest.mark.conformance
@pytest.mark.parametrize("release", RUN)
def test_every_page_command_builds_the_scenario_in_its_release(release):
    result = run(release)
    pages = [p for p in PAGES if p.release == release]
    assert pages, f"no report page shows vLLM {release}"
    assert len(result.outcomes) == sum(len(p.commands) for p in pages)
    failures = [f"{o.page.path}: {line}" for o in result.outcomes for line in o.failures]
    assert failures == [], "\n".join(failures)
    for page in pages:
        assert page.commands or page.reason


@pytest.mark.conformance
@pytest.mark.parametrize("release", RUN)
def test_wrong_commands_are_caught(release):
    result = run(release)
    # caught by the setting it changed, or by vLLM refusing the changed command (a mode without full
    # graphs under adaptive verification is refused by VllmConfig)
    caught = {m.label: [line for line in lines if line.startswith((m.setting, "config: "))] for m, lines in result.mutants}
    assert caught and all(caught.values()), caught
    labels = set(caught)
    assert {"runner variable flipped", "cudagraph_mode changed"} <= labels
    if release in ("0.33.0", "0.34.0"):  # the class page that named an EAGLE-3 head
        assert "EAGLE-3 head where the scenario needs an uncompiled draft" in labels
    if release == "0.34.0":  # the crash's command that named a FlashInfer draft
        assert "FlashInfer draft under adaptive verification" in labels


@pytest.mark.conformance
@pytest.mark.parametrize("release", RUN)
def test_committed_support_by_gpu_is_the_release_code(release):
    assert run(release).support_table == support_by_capability(release)
    assert run(release).adaptive_refused == adaptive_refused(release)


@pytest.mark.conformance
@pytest.mark.parametrize("release", RELEASES)
def test_committed_model_facts_are_the_release_source(release):
    root = release_source(release)
    used = {c.architecture for c in reach.checkpoints().values()} | {"Glm4MoeMTPModel", "DeepSeekMTPModel"}
    facts = model_facts.read(release, root, used)
    stored = model_facts.committed()[release]
    for row in (*facts.targets, *facts.drafts):
        assert stored.model(row.arch) == row, row.arch
    assert facts.mtp_sources == stored.mtp_sources
