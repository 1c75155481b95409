"""A reviewer's branch on Model Runner V2, end to end: unpacked 0.33.0 and 0.34.0 wheels, unedited and
with one edit per area the MRV2 family replays (the mode decisions in ``v1/worker/gpu/model_runner.py``,
the manager in ``v1/worker/gpu/cudagraph_utils.py``, a speculator's manager construction under
``v1/worker/gpu/spec_decode/``, resolve in ``config/compilation.py``), through the command line.

Each edit's branch replay runs on the trace that reaches it (``--traces``): the base side comes from
a cache shared by the module's runs, the branch side is vLLM's code with the edit. ``verify
--vllm-src`` (the model, default base) must never refuse such a tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import trees
from contract.core.modes import CUDAGraphMode, AttentionCGSupport
from contract.core.scenario import DrafterKind, Runner, Scenario, SplittingOps
from contract.families import load_policy, policy_for
from contract.real.corpus import runnable_trace
from vllm_envs import per_kind, require

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("branch-review")]
ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("0.33.0", "0.34.0")
# The scenario that reaches each edit, and what the new class says.
WITNESS = {
    "model_runner": (Scenario(runner=Runner.MRV2, model_compiled=False), "piecewise CUDA graphs"),
    "cudagraph_utils": (Scenario(runner=Runner.MRV2, breakable=True), "P1 target PIECEWISE: no capturer"),
    "spec_decode": (Scenario(runner=Runner.MRV2, breakable=True, drafter=DrafterKind.WITH_MODEL,
                             uniform_decode_query_len=2), "P1 drafter PIECEWISE: no capturer"),
    "resolve": (Scenario(runner=Runner.MRV2, cudagraph_mode=CUDAGraphMode.FULL, splitting_ops=SplittingOps.EMPTY,
                         attention_support=AttentionCGSupport.UNIFORM_BATCH), "P1 target PIECEWISE: no capturer"),
}


# make test replays, on 0.34.0 (the newest release, main), an edit verify reads and one it does not, and
# runs verify on both; 0.33.0's trees and the other pairs are make evidence's, which CI runs after make test.
CONFORMED = {("0.34.0", "model_runner"), ("0.34.0", "cudagraph_utils")}
VERIFIED = {("0.34.0", "model_runner"), ("0.34.0", "cudagraph_utils")}
PAIRS = [(release, area) for release in RELEASES for area in WITNESS]


def cli(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contract.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """The branch replay and verify of every tree a selected test reads, two at a time; and the
    checkout's git status before and after."""
    kinds = {"test_an_edit_is_a_new_class_on_vllms_own_code": ("conform",),
             "test_verify_reads_an_edited_tree_and_says_what_it_does_not_read": ("verify",),
             "test_an_unedited_tree_has_nothing_new": ("conform", "verify")}
    selected = {(item.callspec.params["release"], item.callspec.params.get("area", "unedited"), kind)
                for item in request.session.items if item.module is request.module and hasattr(item, "callspec")
                for kind in kinds[item.originalname]}
    releases = [release for release in RELEASES if any(key[0] == release for key in selected)]
    for release in releases:
        require(release)
    work = tmp_path_factory.mktemp("branch-review")
    env = {**os.environ, "CUDAGRAPH_CONTRACT_CACHE": str(work / "cache"), "VLLM_LOGGING_LEVEL": "ERROR"}
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    jobs = {}
    for release in releases:
        policy = load_policy(policy_for(release, "mrv2"))
        for area, (scenario, _) in WITNESS.items():
            trace = work / f"{release}-{area}.json"
            trace.write_text(runnable_trace(scenario, policy, f"reaches-{area}").dumps())
            tree = trees.edited(release, area, work / f"{release}-{area}")
            jobs[(release, area, "conform")] = ("conform", "--vllm-src", tree, "--base", release, "--traces", trace,
                                                "--reports", work / f"report-{release}-{area}")
            jobs[(release, area, "verify")] = ("verify", "--vllm-src", tree, "--profile", "dev")
        unedited = trees.copy(release, work / f"{release}-unedited")
        every = [x for a in WITNESS for x in ("--traces", work / f"{release}-{a}.json")]
        jobs[(release, "unedited", "conform")] = ("conform", "--vllm-src", unedited, *every,
                                                  "--reports", work / f"report-{release}-unedited")
        jobs[(release, "unedited", "verify")] = ("verify", "--vllm-src", unedited, "--profile", "dev")
    jobs = {key: args for key, args in jobs.items() if key in selected}
    elsewhere = tmp_path_factory.mktemp("cwd")
    # The unedited trees' runs replay every witness on the release first, so the edited trees' runs
    # take their base side from the shared cache, as a reviewer's second run does.
    first = [key for key in jobs if key[1:] == ("unedited", "conform")]
    done = {key: cli(*jobs[key], env=env, cwd=elsewhere) for key in first}
    rest = [key for key in jobs if key not in done]
    with ThreadPoolExecutor(2) as pool:
        done |= dict(zip(rest, pool.map(lambda key: cli(*jobs[key], env=env, cwd=elsewhere), rest)))
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return done, status, after


@pytest.mark.parametrize("release, area", per_kind(PAIRS, CONFORMED))
def test_an_edit_is_a_new_class_on_vllms_own_code(runs, release, area):
    done, _, _ = runs
    proc = done[(release, area, "conform")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    new = [line for line in proc.stdout.splitlines() if line.startswith("  new: ")]
    assert new and any(WITNESS[area][1] in line for line in new), proc.stdout
    edit = trees.EDITS[(release, area)]
    assert f"{edit.path}:" in proc.stdout and ": replayed" in proc.stdout, proc.stdout
    assert "(Model Runner V2)" in proc.stdout.splitlines()[0]
    if (release, "unedited", "conform") in done:  # it replayed this witness on the release already
        assert "the base side from the cache" in proc.stdout, proc.stdout


@pytest.mark.parametrize("release, area", per_kind(PAIRS, VERIFIED))
def test_verify_reads_an_edited_tree_and_says_what_it_does_not_read(runs, release, area):
    done, _, _ = runs
    proc = done[(release, area, "verify")]
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    edit = trees.EDITS[(release, area)]
    said = next(line for line in proc.stdout.splitlines() if line.strip().startswith(edit.path + ":"))
    if area == "model_runner":  # the piecewise_capture_available statement is one of verify's rules
        assert said.endswith("read by verify"), said
    else:
        assert said.endswith("not read by verify"), said
        assert "verify does not read 1 of the changes above" in proc.stdout
        assert "conform --vllm-src" in proc.stdout and f"--base {release}" in proc.stdout
    assert "recognised as" not in proc.stdout


@pytest.mark.parametrize("release", per_kind(RELEASES, {"0.34.0"}))
def test_an_unedited_tree_has_nothing_new(runs, release):
    done, _, _ = runs
    proc = done[(release, "unedited", "conform")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 new" in proc.stdout and "the tree's files equal the base's" in proc.stdout
    verify = done[(release, "unedited", "verify")]
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"recognised as vLLM {release}'s Model Runner V2" in verify.stdout


def test_branch_runs_leave_the_checkout_as_it_was(runs):
    _, before, after = runs
    assert before == after
