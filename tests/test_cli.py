"""The command line: exit codes, and one line for every kind of bad input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.cli import app

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "traces" / "lead3-drafter-capture-outside-window.json"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, needle):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert needle in lines[0], lines[0]


def test_replay_matches_and_exits_zero():
    result = invoke("replay", TRACE)
    assert result.exit_code == 0, result.output
    assert "P4" in result.output


def test_replay_json():
    data = json.loads(invoke("replay", TRACE, "--json").output)
    assert [v["property"] for v in data["violations"]] == ["P0", "P4"]  # the capture guard stops vLLM


def test_replay_under_another_policy_reports_the_difference():
    result = invoke("replay", TRACE, "--policy", "pr56312_draft")
    assert result.exit_code == 1


def _trace(tmp_path, mutate):
    data = json.loads(TRACE.read_text())
    mutate(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return path


BAD_TRACES = {
    "unknown mode name": (lambda d: d["scenario"].update(cudagraph_mode="FULL_PIECEWISE"), "unknown CUDAGraphMode"),
    "unknown schema version": (lambda d: d.update(version=99), "version 99 is not supported"),
    "wrong schema": (lambda d: d.update(schema="other"), "not a cudagraph-contract.trace file"),
    "missing field": (lambda d: d.pop("events"), "missing field 'events'"),
    "unknown event": (lambda d: d["events"].append({"event": "warmup"}), "unknown event 'warmup'"),
    "bad num_tokens": (lambda d: d["events"].append({"event": "propose", "num_tokens": -1}), "positive integer"),
    "unknown scenario field": (lambda d: d["scenario"].update(tp=2), "unknown scenario field"),
    "impossible order": (lambda d: d["events"].insert(0, {"event": "capture_model"}), "cannot happen"),
    "invalid scenario": (lambda d: d["scenario"].update(drafter="NONE"), "invalid scenario"),
}


@pytest.mark.parametrize("kind", sorted(BAD_TRACES))
def test_bad_trace_is_one_line_and_exit_2(tmp_path, kind):
    mutate, needle = BAD_TRACES[kind]
    one_line_error(invoke("replay", _trace(tmp_path, mutate)), needle)


def test_malformed_and_truncated_json(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(TRACE.read_text()[:200])
    one_line_error(invoke("replay", broken), "is not valid JSON")
    one_line_error(invoke("replay", tmp_path / "missing.json"), "does not exist")


def test_huge_trace_is_refused(tmp_path):
    huge = tmp_path / "huge.json"
    huge.write_text(" " * (5 * 1024 * 1024))
    one_line_error(invoke("replay", huge), "larger than")


def test_unknown_policy_name():
    one_line_error(invoke("verify", "--policy", "vllm_0_31"), "unknown policy 'vllm_0_31'")


def test_policy_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import not_a_module_anywhere\n")
    one_line_error(invoke("verify", "--policy", bad), "failed to import")


def test_policy_file_without_the_interface(tmp_path):
    bad = tmp_path / "empty.py"
    bad.write_text("X = 1\n")
    one_line_error(invoke("verify", "--policy", bad), "defines no load_model")


def test_unknown_profile():
    one_line_error(invoke("verify", "--profile", "nightly"), "unknown profile 'nightly'")


def test_user_policy_with_a_counterexample_exits_1(tmp_path):
    mine = tmp_path / "my_branch.py"
    mine.write_text(
        "from contract.api import *\n\n"
        "def load_model(ctx):\n"
        "    return Stacks(ctx.model, ctx.drafter_model)  # forgets every wrapper\n"
    )
    result = invoke("explore", "--policy", mine, "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["my_branch"]["verdicts"]["P1"] is not None


def test_help_works_without_vllm():
    out = subprocess.run([sys.executable, "-m", "contract.cli", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "verify" in out.stdout


def _drawn(trace_path: str, engine: str = "hypothesis"):
    from dataclasses import replace

    from contract.core.trace import load

    return replace(load(ROOT / trace_path), origin={"engine": engine})


def test_verify_says_when_hypothesis_shows_a_violation_the_explorer_lacks(monkeypatch):
    from rich.console import Console

    from contract.cli import verify as verify_cli
    from contract.core.explore import Exploration, explore
    from contract.core.verify import Verdict
    from contract.families import load_policy

    policy = load_policy("vllm_0_30")
    drawn = {"P1": Verdict(policy.name, "P1", False, _drawn("reports/vllm_0_30/P1.json"))}
    completed = {"P1": Verdict(policy.name, "P1", False, _drawn("reports/vllm_0_30/P1.json", "explorer"))}
    said = Console(record=True, width=300)
    monkeypatch.setattr(verify_cli, "out", said)
    everything, nothing = explore(policy, classify=True), Exploration(policy.name, 0, 0)
    verify_cli._print_hypothesis_classes({policy.name: drawn}, {policy.name: everything}, [policy])
    verify_cli._print_hypothesis_classes({policy.name: drawn}, {policy.name: nothing}, [policy])
    verify_cli._print_hypothesis_classes({policy.name: completed}, {policy.name: nothing}, [policy])
    lines = said.export_text().splitlines()
    assert lines[0] == "vllm_0_30: Hypothesis's counterexamples show 2 kinds of violation, all among the explorer's classes"
    assert lines[1].startswith("vllm_0_30: Hypothesis's counterexamples show 2 kinds of violation, 2 outside the "
                               "explorer's classes: P1 target"), lines[1]
    assert len(lines) == 2  # a verdict the explorer completed is no counterexample of Hypothesis's


def test_verify_shows_the_explorers_shortest_and_runs_hypothesis_unshrunk(monkeypatch):
    from hypothesis import Phase

    import contract.core.verify
    from contract.cli import verify as verify_cli
    from contract.core.explore import Exploration
    from contract.core.profiles import get
    from contract.core.verify import Verdict, verify_policy
    from contract.families import load_policy

    longer = _drawn("tests/traces/lead3-drafter-capture-outside-window.json")
    shortest = _drawn("reports/vllm_0_30/P1.json", "explorer")
    assert len(longer.events) > len(shortest.events)
    verdict = Verdict("vllm_0_30", "P1", False, longer)
    found = Exploration("vllm_0_30", 0, 0, counterexamples={"P1": shortest})
    assert f"fails ({len(shortest.events)} events)" in verify_cli._cell(verdict, found)
    assert verify_cli._shortest(verdict, found) is shortest
    alone = verify_cli._cell(verdict, Exploration("vllm_0_30", 0, 0))
    assert f"fails ({len(longer.events)} events, Hypothesis only, unshrunk)" in alone

    phases = []
    monkeypatch.setattr(contract.core.verify, "run_machine", lambda policy, settings, *a, **k: phases.append(settings.phases))
    verify_policy(load_policy("vllm_0_30"), get("ci"), shrink=False)
    verify_policy(load_policy("vllm_0_30"), get("ci"))
    assert Phase.shrink not in phases[0] and Phase.generate in phases[0] and Phase.shrink in phases[1]
