"""``verify --vllm-src``: a vLLM tree's own ``load_model`` wrapping block, recognised or run as a policy.

The trees are the releases' sources (``.venv-vllm-*``, or ``.vllm-src/`` for a release ``make test``
reads but does not run); without them the tests skip, or fail when ``CONTRACT_REQUIRE_VLLM=1``.
"""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.branch import tree as branch
from contract.branch.base import family_files
from contract.runners.mrv1 import branch as mrv1_branch
from contract.core.modes import CUDAGraphMode
from contract.runners.mrv1.model.wrappers import LoadContext, RawModel
from contract.cli import app
from contract.core.explore import explore
from contract.families import by_name, load_policy
from contract.core.properties import PROPERTIES
from contract.core.scenario import ConfigRevision
from vllm_envs import per_kind, release_source

ROOT = Path(__file__).resolve().parents[1]
NEEDED = mrv1_branch.FILES
# The second `if` of 0.30.0's block (gpu_model_runner.py:5477-5480), the one #56312 split from the
# breakable branch; `elif` puts back 0.29.0's "breakable replaces the FULL wrapper".
SECOND_IF = "\n        if (\n            cudagraph_mode.has_full_cudagraphs()"
runner = CliRunner()


def copy_tree(pkg: Path, dest: Path, files=NEEDED) -> Path:
    """The files ``verify`` reads, and every file Model Runner V1's replay imports, so that ``--base
    auto`` compares the copy with whole releases rather than with missing files."""
    for rel in {*files, *family_files(by_name("mrv1"), pkg)}:
        (dest / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pkg / rel, dest / "vllm" / rel)
    return dest


def verify(*args):
    return runner.invoke(app, ["verify", *map(str, args)])


def one_line_error(result, needle):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output


RECOGNISED = [("0.30.0", "vllm_0_30"), ("0.29.0", "vllm_0_29")]


@pytest.mark.parametrize("version, policy", RECOGNISED)
def test_installed_release_reads_as_its_rules(version, policy):
    found = branch.load(release_source(version))
    assert (found.release, found.policy.name) == (version, policy)


# Model Runner V1 trees through verify: make evidence's, which CI runs after make test (the branch review
# takes Model Runner V2 trees through the same commands in make test)
@pytest.mark.parametrize("version, policy", per_kind(RECOGNISED, set()))
def test_installed_release_is_recognised(version, policy):
    pkg = release_source(version)
    result = verify("--vllm-src", pkg, "--json")
    assert result.exit_code == 0, result.output
    assert f"the rules of vLLM {version}" in result.output
    assert f"recognised as vLLM {version}'s Model Runner V1" in result.output
    assert policy in json.loads(result.output[result.output.index("{"):])


@pytest.mark.evidence
def test_unedited_copy_exits_0_with_nothing_new(tmp_path):
    """A copy of the release's files, not recognised as the release itself, is compared with it
    (``--base auto``) and adds nothing."""
    tree = copy_tree(release_source("0.30.0"), tmp_path / "same")
    result = verify("--vllm-src", tree, "--profile", "dev", "--seed", "0")
    assert result.exit_code == 0, result.output
    assert "base auto: vLLM 0.30.0" in result.output
    assert "nothing new" in result.output


@pytest.mark.evidence
def test_elif_restored_is_unknown_and_caught(tmp_path):
    tree = copy_tree(release_source("0.30.0"), tmp_path / "elif-branch")
    path = tree / "vllm" / mrv1_branch.RUNNER_FILE
    source = path.read_text()
    assert source.count(SECOND_IF) == 1
    path.write_text(source.replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))

    found = branch.load(tree)
    assert found.release is None and found.policy.name == "branch@elif-branch"
    # Against 0.30.0 in lockstep: the regression shows where the two differ, not only where
    # 0.30.0 already fails.
    assert explore(found.policy, base=load_policy("vllm_0_30"), first_only=True).counterexamples

    result = verify("--vllm-src", tree, "--json")
    assert result.exit_code == 1, result.output
    assert "not a release's rules, run as a policy (branch@elif-branch)" in result.output
    verdicts = json.loads(result.output[result.output.index("{"):])["branch@elif-branch"]
    assert not verdicts["P1"]["holds"]
    # compared with the release it starts from (--base auto), it names what it adds
    differential = verdicts["differential"]
    assert differential["base_chosen"].startswith("base auto: vLLM 0.30.0 (Model Runner V1, policy vllm_0_30)")
    assert [c["title"] for c in differential["new"]] == ["P1 target FULL: no capturer, under breakable on"]


@pytest.mark.parametrize("version, policy", [("0.30.0", "vllm_0_30")])
def test_block_run_as_a_policy_matches_the_built_in(version, policy):
    found = branch.load(release_source(version), as_policy=True)
    assert found.release is None and found.policy.config_revision is ConfigRevision.V0_30
    mine, built_in = explore(found.policy), explore(load_policy(policy))
    assert (mine.states, mine.transitions) == (built_in.states, built_in.transitions)
    for pid in PROPERTIES:
        assert mine.holds(pid) == built_in.holds(pid), pid
        if not mine.holds(pid):
            a, b = mine.counterexamples[pid], built_in.counterexamples[pid]
            assert (a.scenario, a.events, a.expected_steps) == (b.scenario, b.events, b.expected_steps), pid


def test_0_29_block_reads_as_0_29(tmp_path):
    """0.29.0's classes: no runtime_mode on the breakable wrapper, unwrap() does not recurse."""
    pkg = release_source("0.29.0")
    found = branch.load(pkg, as_policy=True)
    assert found.policy.config_revision is ConfigRevision.V0_29
    ctx = LoadContext(CUDAGraphMode.FULL, True, False, RawModel(), RawModel("drafter.model"))
    assert found.policy.load_model(ctx) == load_policy("vllm_0_29").load_model(ctx)


def test_tree_with_neither_runner(tmp_path):
    (tmp_path / "vllm" / "v1" / "worker").mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    one_line_error(verify("--vllm-src", tmp_path), "is neither Model Runner V1 nor V2")


def test_call_the_branch_class_refuses(tmp_path):
    """0.30.0's block (runtime_mode=PIECEWISE) on 0.29.0's breakable class is refused up front."""
    tree = copy_tree(release_source("0.30.0"), tmp_path / "mixed")
    shutil.copy(release_source("0.29.0") / mrv1_branch.BREAKABLE_FILE, tree / "vllm" / mrv1_branch.BREAKABLE_FILE)
    path = tree / "vllm" / mrv1_branch.RUNNER_FILE
    path.write_text(path.read_text().replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))
    one_line_error(verify("--vllm-src", tree), "does not match the branch's class")
