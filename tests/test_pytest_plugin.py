"""The pytest plugin, run as vLLM's CI would run it: each new class a failing item with its witness."""

import importlib.metadata

import pytest

from test_classes import NESTED_FULL

pytest_plugins = ("pytester",)

SAME_AS_0_30 = NESTED_FULL.replace("runtime_mode=FULL)\n        if drafter", "runtime_mode=PIECEWISE)\n        if drafter")


@pytest.fixture(autouse=True)
def _time_limit_restored():
    """The plugin sets the child's time limit of the process it runs in, pytester's in-process runs
    included: the next test starts from the default again."""
    yield
    from contract.core import child

    child.set_time_limit(child.DEFAULT_TIMEOUT_S)


def test_the_entry_point_is_registered():
    names = {e.name: e.value for e in importlib.metadata.entry_points(group="pytest11")}
    assert names.get("cudagraph_contract") == "contract.plugin"


def test_each_new_class_is_a_failing_item_with_its_witness(pytester):
    policy = pytester.makepyfile(nested_full=NESTED_FULL)
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-base", "vllm_0_30")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1 and "passed" not in outcomes
    result.stdout.fnmatch_lines([
        "*cudagraph_contract::nested_full::new::P1-target-FULL-nested-capture--breakable*",
        "*new in nested_full (not in vllm_0_30), crash at start-up: P1 target FULL: nested capture, under breakable on*",
        "*shortest witness (3 events): load_model * profile_run * profile_cudagraph_memory*",
        "*nested_full: base vllm_0_30; * new, * lost graphs, * traded, 0 fixed, * inherited*",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_nothing_new_is_one_passing_item(pytester):
    policy = pytester.makepyfile(same_as_0_30=SAME_AS_0_30)
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-base", "vllm_0_30")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*same_as_0_30: base vllm_0_30; 0 new, 0 lost graphs, 0 traded, 0 fixed, * inherited*"])


def test_hypothesis_profile_adds_its_own_items(pytester):
    policy = pytester.makepyfile(nested_full=NESTED_FULL)
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-base", "vllm_0_30",
                                "--cudagraph-contract-profile", "ci")
    result.stdout.fnmatch_lines(["*cudagraph_contract::nested_full::hypothesis::P1-target-FULL-nested-capture*"])


def test_a_bad_base_is_a_usage_error(pytester):
    policy = pytester.makepyfile(same_as_0_30=SAME_AS_0_30)
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-base", "vllm_9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cudagraph-contract: --base vllm_9: no such release, policy or folder*"])


def test_without_options_the_plugin_adds_nothing(pytester):
    pytester.makepyfile(test_one="def test_one():\n    assert True\n")
    pytester.runpytest().assert_outcomes(passed=1)


def test_a_policy_file_runs_in_a_child_not_in_pytest(pytester):
    """A policy file that ends its process at import ends only its child: pytest says so as a usage
    error instead of exiting 0 with it."""
    policy = pytester.makepyfile(exits="import os\nos._exit(0)\n")
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-timeout", "30")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*cudagraph-contract: policy file {policy} exited with status 0 before reporting a "
                                 "result*"])


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_timeout_out_of_range_is_a_usage_error_naming_the_plugins_option(pytester, value):
    policy = pytester.makepyfile(same_as_0_30=SAME_AS_0_30)
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-timeout", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cudagraph-contract: --cudagraph-contract-timeout must be a number of seconds "
                                 "from 1 to 604800*"])


def test_a_looping_policy_file_is_stopped_and_the_message_names_the_plugins_option(pytester):
    policy = pytester.makepyfile(loops="while True:\n    pass\n")
    result = pytester.runpytest("--cudagraph-contract-policy", str(policy), "--cudagraph-contract-timeout", "1")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*did not finish within 1 s; pass --cudagraph-contract-timeout to allow more*"])


def test_without_the_bases_source_the_tree_is_never_a_silent_pass(tmp_path):
    """Where the base release's package is not on this machine, no change can be named as read or not:
    the plugin says so, with the replay that checks them, as ``verify --vllm-src`` does."""
    from dataclasses import replace

    from contract.branch import base as base_mod
    from contract.branch import tree as branch
    from contract.plugin import _unread
    from trees import copy

    tree = branch.load(copy("0.34.0", tmp_path))
    chosen = base_mod.resolve(base_mod.check("0.34.0"), tree.policy, tree)
    assert chosen.package is not None and _unread(tree, chosen) == []  # an unedited tree: nothing to say
    said = _unread(tree, replace(chosen, package=None))
    assert len(said) == 1 and said[0].startswith("no base source on this machine to compare the tree with"), said
    assert said[0].endswith(f"cudagraph-contract conform --vllm-src {tree.tree} --base 0.34.0"), said
