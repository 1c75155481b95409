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
    # A crash in the code under review is a finding, never the tool's error (exit 2).
    "dispatch": (Scenario(runner=Runner.MRV2), "P0: vLLM stops when serving (IndexError: list index out of range)"),
    # A change the replay never runs: said, and exit 3 rather than "nothing new".
    "unreached": (Scenario(runner=Runner.MRV2), ""),
    "spec_decode": (Scenario(runner=Runner.MRV2, breakable=True, drafter=DrafterKind.WITH_MODEL,
                             uniform_decode_query_len=2), "P1 drafter PIECEWISE: no capturer"),
    "resolve": (Scenario(runner=Runner.MRV2, cudagraph_mode=CUDAGraphMode.FULL, splitting_ops=SplittingOps.EMPTY,
                         attention_support=AttentionCGSupport.UNIFORM_BATCH), "P1 target PIECEWISE: no capturer"),
}


# make test replays, on 0.34.0 (the newest release, main), an edit verify reads and one that makes vLLM's
# code raise, and runs verify on an edit it reads and one it does not; 0.33.0's trees and the other pairs
# are make evidence's, which CI runs after make test.
CONFORMED = {("0.34.0", "model_runner"), ("0.34.0", "dispatch")}
VERIFIED = {("0.34.0", "model_runner"), ("0.34.0", "cudagraph_utils")}
PAIRS = [(release, area) for release in RELEASES for area in WITNESS
         if (release, area) in trees.EDITS and area != "unreached"]


def cli(*args, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contract.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, request):
    """The branch replay and verify of every tree a selected test reads, two at a time; and the
    checkout's git status before and after."""
    kinds = {"test_an_edit_is_a_new_class_on_vllms_own_code": ("conform",),
             "test_a_change_no_trace_runs_is_said_and_exits_3": ("conform", "conform-allowing-unexercised"),
             "test_verify_reads_an_edited_tree_and_says_what_it_does_not_read": ("verify",),
             "test_an_unedited_tree_has_nothing_new": ("conform", "verify"),
             "test_the_callers_environment_changes_no_verdict": ("conform", "conform-in-the-trees-environment"),
             "test_a_tree_that_rewrites_the_cache_cannot_decide_the_next_review": ("conform",)}
    selected = {(item.callspec.params["release"], item.callspec.params.get("area", "unedited"), kind)
                for item in request.session.items if item.module is request.module and hasattr(item, "callspec")
                for kind in kinds[item.originalname]}
    releases = [release for release in RELEASES if any(key[0] == release for key in selected)]
    for release in releases:
        require(release)
    work = tmp_path_factory.mktemp("branch-review")
    env = {**os.environ, "CUDAGRAPH_CONTRACT_CACHE": str(work / "cache"), "VLLM_LOGGING_LEVEL": "ERROR"}
    elsewhere = tmp_path_factory.mktemp("cwd")
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    jobs = {}
    for release in releases:
        policy = load_policy(policy_for(release, "mrv2"))
        for area, (scenario, _) in WITNESS.items():
            trace = work / f"{release}-{area}.json"
            trace.write_text(runnable_trace(scenario, policy, f"reaches-{area}").dumps())
            if (release, area) not in trees.EDITS:
                continue
            tree = trees.edited(release, area, work / f"{release}-{area}")
            jobs[(release, area, "conform")] = ("conform", "--vllm-src", tree, "--base", release, "--traces", trace,
                                                "--reports", work / f"report-{release}-{area}")
            jobs[(release, area, "verify")] = ("verify", "--vllm-src", tree, "--profile", "dev")
            jobs[(release, area, "conform-allowing-unexercised")] = (*jobs[(release, area, "conform")][:-1],
                                                                    work / f"report-{release}-{area}-allowed",
                                                                    "--allow-unexercised")
            # A vLLM developer's usual set-up: the tree on PYTHONPATH, and settings that change what runs;
            # the tree named by a path relative to the folder the command runs from.
            relative = os.path.relpath(tree, elsewhere)
            jobs[(release, area, "conform-in-the-trees-environment")] = (
                "conform", "--vllm-src", relative, *jobs[(release, area, "conform")][3:-1],
                work / f"report-{release}-{area}-env",
                {"PYTHONPATH": str(tree), "PYTHONOPTIMIZE": "1", "PYTEST_ADDOPTS": "-x", "VLLM_USE_V2_MODEL_RUNNER": "0"})
        unedited = trees.copy(release, work / f"{release}-unedited")
        every = [x for a in WITNESS for x in ("--traces", work / f"{release}-{a}.json")]
        # No --reports: the report goes to the cache folder, never into the folder it runs from.
        jobs[(release, "unedited", "conform")] = ("conform", "--vllm-src", unedited, *every)
        jobs[(release, "unedited", "verify")] = ("verify", "--vllm-src", unedited, "--profile", "dev")
    jobs = {key: args for key, args in jobs.items() if key in selected}
    # The unedited trees' runs replay every witness on the release first, so the edited trees' runs
    # take their base side from the shared cache, as a reviewer's second run does.
    first = [key for key in jobs if key[1:] == ("unedited", "conform")]

    def run(key):
        args = jobs[key]
        extra = args[-1] if isinstance(args[-1], dict) else {}
        return cli(*(args[:-1] if extra else args), env=env | extra, cwd=elsewhere)

    done = {key: run(key) for key in first}
    rest = [key for key in jobs if key not in done]
    with ThreadPoolExecutor(2) as pool:
        done |= dict(zip(rest, pool.map(run, rest)))
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    return done, status, after, (work, env, elsewhere, jobs)


@pytest.mark.parametrize("release, area", per_kind(PAIRS, CONFORMED))
def test_an_edit_is_a_new_class_on_vllms_own_code(runs, release, area):
    done, *_ = runs
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
    done, *_ = runs
    proc = done[(release, area, "verify")]
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    edit = trees.EDITS[(release, area)]
    said = next(line for line in proc.stdout.splitlines() if line.strip().startswith(edit.path + ":"))
    if area == "model_runner":  # the piecewise_capture_available statement is one of verify's rules
        assert said.endswith("read by verify"), said
    elif area == "resolve":  # verify reads resolve's Mamba check, which the edit leaves as it was
        assert said.endswith("verify reads part of it, unchanged there"), said
    else:
        assert said.endswith("not read by verify"), said
        assert "verify does not read 1 of the changes above" in proc.stdout
        assert "conform --vllm-src" in proc.stdout and f"--base {release}" in proc.stdout
    assert "recognised as" not in proc.stdout


@pytest.mark.parametrize("release", per_kind(RELEASES, {"0.34.0"}))
def test_an_unedited_tree_has_nothing_new(runs, release):
    done, _, _, (work, env, cwd, _) = runs
    proc = done[(release, "unedited", "conform")]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 new" in proc.stdout and "the tree's files equal the base's" in proc.stdout
    report = Path(proc.stdout.strip().splitlines()[-1].removeprefix("report: "))
    assert report.is_file() and report.is_relative_to(Path(env["CUDAGRAPH_CONTRACT_CACHE"]) / "reports" / "branch")
    assert f"the report goes to {report.parent}" in proc.stderr
    assert not list(cwd.iterdir()), "a branch run wrote into the folder it ran from"
    verify = done[(release, "unedited", "verify")]
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"recognised as vLLM {release}'s Model Runner V2" in verify.stdout


def test_branch_runs_leave_the_checkout_as_it_was(runs):
    _, before, after, _ = runs
    assert before == after


def new_lines(proc) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("  new: ")]


# make evidence's: the children's explicit environment is make test's in test_child.py and test_named_code.py
@pytest.mark.parametrize("release, area", per_kind([("0.34.0", "model_runner")], set()))
def test_the_callers_environment_changes_no_verdict(runs, release, area):
    """``PYTHONPATH`` at the tree (it would put the tree on the base side too), ``PYTHONOPTIMIZE``
    (vLLM's asserts), pytest's and vLLM's switches: the same exit and the same new classes."""
    done, *_ = runs
    plain, hostile = done[(release, area, "conform")], done[(release, area, "conform-in-the-trees-environment")]
    assert hostile.returncode == plain.returncode == 1, hostile.stdout + hostile.stderr
    assert new_lines(hostile), hostile.stdout + hostile.stderr
    assert [line.split(" — witness")[0] for line in new_lines(hostile)] == \
        [line.split(" — witness")[0] for line in new_lines(plain)]


# A tree whose code, while the branch side runs, rewrites the base cache so that the next review of the
# same edit finds its class on the release too (the branch's own steps as the release's, the digest
# recomputed): the cheapest way to silence a reviewer who keeps a cache.
POISON = """

def _poison():
    import glob, hashlib, json, os
    for path in glob.glob(os.path.join(os.environ["CUDAGRAPH_CONTRACT_CACHE"], "base-observations", "*.json")):
        data = json.load(open(path))
        content = data.get("content")
        if not isinstance(content, dict) or {digest!r} not in content.get("observations", {{}}):
            continue
        content["observations"][{digest!r}] = {{"name": "forged", "steps": {steps!r}, "path": []}}
        data["digest"] = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        json.dump(data, open(path, "w"))


_poison()
"""


@pytest.mark.parametrize("release, area", per_kind([("0.34.0", "model_runner")], set()))
def test_a_tree_that_rewrites_the_cache_cannot_decide_the_next_review(runs, release, area):
    import json

    from contract.branch.cache import trace_digest
    from contract.core.trace import load

    done, _, _, (work, env, cwd, jobs) = runs
    honest = done[(release, area, "conform")]
    assert honest.returncode == 1, honest.stdout + honest.stderr
    witness = new_lines(honest)[0].split(" — witness ")[1]
    steps = json.loads(Path(witness).read_text())["expected"]["steps"]
    digest = trace_digest(load(work / f"{release}-{area}.json"))
    poisoner = trees.edited(release, area, work / f"{release}-{area}-poisoner")
    runner = poisoner / "vllm" / trees.EDITS[(release, area)].path
    runner.write_text(runner.read_text() + POISON.format(digest=digest, steps=steps))
    args = jobs[(release, area, "conform")]
    poisoned = cli(*args[:2], poisoner, *args[3:-1], work / "report-poisoner", env=env, cwd=cwd)
    assert "changed while the tree's code ran: removed" in poisoned.stdout, poisoned.stdout + poisoned.stderr
    again = cli(*args[:-1], work / "report-again", env=env, cwd=cwd)
    assert again.returncode == 1, again.stdout + again.stderr
    assert [line.split(" — witness")[0] for line in new_lines(again)] == \
        [line.split(" — witness")[0] for line in new_lines(honest)]


@pytest.mark.parametrize("release, area", per_kind([("0.34.0", "unreached")], {("0.34.0", "unreached")}))
def test_a_change_no_trace_runs_is_said_and_exits_3(runs, release, area):
    done, *_ = runs
    proc = done[(release, area, "conform")]
    assert proc.returncode == 3, proc.stdout + proc.stderr
    said = next(line for line in proc.stdout.splitlines() if line.startswith("NOT EXERCISED: "))
    assert "v1/worker/gpu/cudagraph_utils.py:make_cudagraph_stats" in said and "nothing new" in proc.stdout
    allowed = done[(release, area, "conform-allowing-unexercised")]
    assert allowed.returncode == 0 and "NOT EXERCISED: " in allowed.stdout, allowed.stdout + allowed.stderr
