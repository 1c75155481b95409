"""P1–P6 on vLLM's own observations: the judge reads the replay's step form back and finds what
the model's checks find; ``conform --vllm-src --base`` reports the classes vLLM's code shows new."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.runners.mrv1 import branch as mrv1_branch
from contract.cli import app
from contract.real import judge
from contract.core.explore import DEFAULT_DEPTH, explore
from contract.families import BY_NAME, mutant_policy
from contract.families import BUILT_IN, by_runner, load_policy
from explored import GROUP, explored
from test_vllm_src import SECOND_IF, copy_tree
from vllm_envs import installed

pytestmark = GROUP
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


# breakable_acts_on_none's state graph reaches no fixpoint within the default depth (12 events), and
# every class it shows there shows by 8 events with the same witness, in a fifth of the time.
DEPTH = {"breakable_acts_on_none": 8}


@pytest.mark.parametrize("name", [*BUILT_IN, "entries_never_stored", "capture_window_never_closed", "breakable_acts_on_none"])
def test_judge_on_recorded_steps_finds_the_models_violations(name):
    policy = mutant_policy(BY_NAME[name]) if name in BY_NAME else load_policy(name)
    ex = explore(policy, classify=True, depth=DEPTH.get(name, DEFAULT_DEPTH)) if name in BY_NAME else explored(name)
    assert ex.classes
    for c in ex.classes:
        version = {"mrv2_0_33": "0.33.0"}.get(policy.name, "0.34.0")  # the releases' readings of profiling
        family = by_runner(policy.runner)
        _, found = judge.violations(c.witness.expected_steps, c.witness.events, c.witness.scenario,
                                    family.descriptor_from_json,
                                    profiling_skipped=family.profiling_skipped(c.witness.scenario, version))
        assert [v.to_json() for v in found] == c.witness.expected_violations, c.title


def test_judge_reads_every_layer_label():
    assert judge.layer_kind("target[0]:UBatchWrapper(FULL).cudagraph_wrapper")[0].value == "CUDAGraphWrapper"
    assert judge.layer_kind("drafter[0]:BreakableCUDAGraphWrapper(None)") == (judge.LayerKind.BreakableCUDAGraphWrapper, None)
    assert judge.layer_kind("target:compiled")[0] is judge.LayerKind.compiled


def _trees(tmp_path):
    pkg = installed("0.30.0")
    edited = copy_tree(pkg, tmp_path / "elif-branch")
    path = edited / "vllm" / mrv1_branch.RUNNER_FILE
    path.write_text(path.read_text().replace(SECOND_IF, SECOND_IF.replace("if (", "elif (")))
    return edited, copy_tree(pkg, tmp_path / "same")


@pytest.mark.conformance
@pytest.mark.evidence
def test_conform_base_reports_the_new_classes_from_vllms_own_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a branch replay's report folder goes into the working folder
    edited, same = _trees(tmp_path)
    traces = tmp_path / "traces"
    assert runner.invoke(app, ["explore", "--policy", "vllm_0_30", "--out", str(traces), "-q"]).exit_code == 0
    result = runner.invoke(app, ["conform", "--vllm-src", str(edited), "--base", "0.30.0",
                                 "--traces", str(traces), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout[result.stdout.index("{"):])
    assert data["tree_modules"] == ["vllm.v1.worker.gpu_model_runner"]
    new = {(c["property"], c["role"], c["runtime_mode"], c["what"]) for c in data["new"]}
    assert ("P1", "target", "FULL", "no capturer") in new
    assert all(c["witness"]["events"] for c in data["new"])
    assert not data["fixed"] and data["inherited"]

    unedited = runner.invoke(app, ["conform", "--vllm-src", str(same), "--base", "0.30.0", "--traces", str(traces)])
    assert unedited.exit_code == 0, unedited.output
    assert "nothing new" in unedited.output and "modules taken from the tree: none" in unedited.output
