"""Break-point ops in breakable PIECEWISE graphs: the capture breaks at the attention op
(``@eager_break_during_capture`` on ``unified_attention_with_output``), and on Model Runner V2 the
graph serves its batch unpadded in requests (the ops read the real batch). P7 holds an op captured
into a graph segment to be a wrong result, a batch padded with empty requests an unsupported shape.
The replay runs the release's own op body, marked where the release's source marks it; an edited
0.34.0 tree that drops the decorator is a new class."""

from __future__ import annotations

import pytest

from contract.core.classes import ATTENTION_CAPTURED, BREAKABLE_PADDED, Severity, of_trace
from contract.core.events import START_UP, ExecuteModel
from contract.core.modes import CUDAGraphMode
from contract.core.scenario import Runner, Scenario
from contract.core.trace import record_runnable, run_events
from contract.families import BY_NAME, load_policy, mutant_policy
from contract.real.attention_op import ATTENTION_FUNCTION, MARKER, marks_attention

BREAKABLE = Scenario(runner=Runner.MRV2, breakable=True, cudagraph_mode=CUDAGraphMode.PIECEWISE)
SERVE = [*START_UP, ExecuteModel(3)]
UNMARKED = ("@eager_break_during_capture\n@maybe_transfer_kv_layer\ndef unified_attention_with_output(",
            "@maybe_transfer_kv_layer\ndef unified_attention_with_output(")


def test_the_release_marks_its_attention_op_and_an_edit_that_drops_the_marker_is_read(tmp_path):
    from vllm_envs import release_source

    source = release_source("0.34.0") / "model_executor" / "layers" / "attention" / "attention.py"
    assert marks_attention(source)
    text = source.read_text()
    assert UNMARKED[0] in text
    edited = tmp_path / "attention.py"
    edited.write_text(text.replace(*UNMARKED))
    assert not marks_attention(edited)
    edited.write_text(text.replace(f"def {ATTENTION_FUNCTION}(", "def renamed("))
    with pytest.raises(RuntimeError, match=f"defines no {ATTENTION_FUNCTION}"):
        marks_attention(edited)
    assert MARKER in text


@pytest.mark.parametrize("runner, mutant", [(Runner.MRV2, "mrv2_attention_without_eager_break"),
                                            (Runner.MRV1, "attention_without_eager_break")])
def test_an_unmarked_attention_op_is_a_wrong_result_in_breakable_captures_only(runner, mutant):
    m = BY_NAME[mutant]
    scenario = Scenario(runner=runner, breakable=True, cudagraph_mode=CUDAGraphMode.PIECEWISE)
    run, found = run_events(scenario, mutant_policy(m), SERVE)
    captured = [d for r in run.records for d in r.dispatches if d.attention_captured]
    assert captured and all(d.runtime_mode is CUDAGraphMode.PIECEWISE for d in captured)
    classes = of_trace(record_runnable(scenario, mutant_policy(m), SERVE, name=mutant), mutant_policy(m))
    p7 = [c for c in classes if c.signature.property == "P7"]
    assert p7 and {c.severity for c in p7} == {Severity.WRONG_RESULT}
    assert all(c.signature.what == ATTENTION_CAPTURED for c in p7)
    base, _ = run_events(scenario, load_policy(m.base), SERVE)
    assert not any(d.attention_captured for r in base.records for d in r.dispatches)
    plain, _ = run_events(Scenario(runner=runner, cudagraph_mode=CUDAGraphMode.PIECEWISE), mutant_policy(m), SERVE)
    assert not any(d.attention_captured for r in plain.records for d in r.dispatches)


def test_a_breakable_piecewise_graph_padded_in_requests_is_an_unsupported_shape():
    """vLLM #48822's padding, the mutant ``mrv2_breakable_pads_requests``: a mixed batch of 3 tokens
    replays the breakable graph of 4 with a fourth, empty request; 0.34.0 pads none."""
    m = BY_NAME["mrv2_breakable_pads_requests"]
    script = [*SERVE, ExecuteModel(3), ExecuteModel(4)]
    classes = of_trace(record_runnable(BREAKABLE, mutant_policy(m), script, name=m.name), mutant_policy(m))
    p7 = [c for c in classes if c.signature.property == "P7"]
    assert [c.signature.what for c in p7] == [BREAKABLE_PADDED] and p7[0].severity is Severity.UNSUPPORTED_SHAPE
    assert "(4 for its 3)" in p7[0].message
    run, violations = run_events(BREAKABLE, load_policy("mrv2_0_34"), script)
    assert not [v for v in violations if v.property == "P7"]
    unbroken = Scenario(runner=Runner.MRV2, cudagraph_mode=CUDAGraphMode.PIECEWISE)
    assert not [v for v in run_events(unbroken, mutant_policy(m), script)[1] if v.property == "P7"]


@pytest.mark.evidence
@pytest.mark.conformance
def test_an_edited_0_34_tree_whose_attention_op_has_no_eager_break_is_a_new_p7(tmp_path):
    from vllm_envs import conform_tree, edited_tree

    tree = edited_tree(tmp_path, "0.34.0", "model_executor/layers/attention/attention.py", *UNMARKED)
    data = conform_tree(tree, record_runnable(BREAKABLE, load_policy("mrv2_0_34"), SERVE, name="breakable"),
                        tmp_path)
    new = [c for c in data["new"] if c["property"] == "P7"]
    assert new and all(c["what"] == ATTENTION_CAPTURED for c in new), data["new"]
