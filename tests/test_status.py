"""Labels per counterexample follow the affected-release matrix, and say what a confirmation ran."""

from __future__ import annotations

import re
from pathlib import Path

from contract.evidence import matrix, status
from contract.core.scenario import Runner
from contract.core.trace import load

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = matrix.load_conformance(ROOT / "reports" / "conformance")


def label(policy: str, prop: str, conformance=CONFORMANCE) -> status.Status:
    return status.status(load(ROOT / "reports" / policy / f"{prop}.json"), conformance)


def test_the_bug_56312_fixed_is_a_known_positive_control():
    s = label("vllm_0_29", "P3")
    assert s.kind == "known, fixed upstream"
    assert "#56312" in s.text and "0.29.0's code on CPU, CUDA graphs simulated" in s.text


def test_a_counterexample_no_release_fixes_is_new():
    s = label("vllm_0_30", "P1")
    assert s.kind == "new"
    assert "runner steps (`profile_run`" in s.text and "stand-in" in s.text  # EAGLE drafter, no draft model
    assert not re.search(r":\d", s.text)  # lines are cited from the replay's path, not written here


def test_mrv2_confirmation_says_what_the_mrv2_replay_runs():
    trace = load(ROOT / "tests" / "traces" / "mrv2-0.34-l1-compiled-under-full-then-upgraded.json")
    text = status.what_ran(trace, "0.34.0")
    assert "`initialize_kv_cache` and `execute_model` blocks" in text and "real Dynamo" in text
    assert "load_model` wrapping block" not in text and "gpu_model_runner.py" not in text
    mrv1 = status.what_ran(load(ROOT / "reports" / "vllm_0_30" / "P4.json"), "0.30.0")
    assert "`load_model` wrapping block" in mrv1 and "`propose`'s batch-to-dispatch statements" in mrv1


def test_unreleased_is_reading_and_a_confirmed_mrv2_witness_is_new():
    assert label("mrv2_0_34", "P1").kind == "new"  # replayed on 0.34.0's MRV2 and confirmed
    draft = label("pr56312_draft", "P1")
    assert draft.kind == "reading" and "models no released vLLM" in draft.text


def test_a_refuting_replay_takes_the_label_back():
    p3 = load(ROOT / "reports" / "vllm_0_29" / "P3.json")
    refuted = {("0.29.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed", "steps": 3, "agreeing": 2}]}}
    s = status.status(p3, refuted)
    assert s.kind == "refuted" and "vLLM 0.29.0" in s.text and "2 of 3 steps agree" in s.text
    earlier = {k: v for k, v in CONFORMANCE.items() if k[1] is not Runner.MRV1 or k[0] <= "0.29.0"}
    still = {**earlier, ("0.30.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed",
                                                               "steps": 3, "agreeing": 1}]}}
    assert status.status(p3, still).kind == "new"  # no later release replayed as fixed


def test_a_witness_no_replay_ran_says_so_with_the_command():
    p4 = load(ROOT / "reports" / "vllm_0_30" / "P4.json")
    s = status.status(p4, {}, "reports/vllm_0_30/P4.json")
    assert s.kind == "reading"
    assert s.text == ("reading: not replayed on real vLLM yet (`cudagraph-contract conform --vllm 0.30.0 "
                      "--traces reports/vllm_0_30/P4.json` replays it)")
    skipped = {("0.34.0", Runner.MRV2): {"traces": [{"name": "x", "status": "not replayed (MRV2 speculator)"}]}}
    mrv2 = load(ROOT / "tests" / "traces" / "mrv2-0.34-l2-uncompiled-draft-piecewise-eager.json")
    mrv2.name = "x"
    mrv2.policy = "mrv2_0_34"
    assert status.status(mrv2, skipped).text == "reading: not replayed on real vLLM yet (MRV2 speculator)"


def test_a_witness_of_no_property_is_confirmed_when_vllm_does_the_same():
    """A differential's lost-graphs witness names no property: the replay agreeing is the confirmation."""
    trace = load(ROOT / "reports" / "vllm_0_30" / "P4.json")
    trace.property, trace.name = None, "lost-graphs-witness"
    n = len(trace.events)
    replayed = {("0.30.0", Runner.MRV1): {"traces": [{"name": trace.name, "status": "replayed", "steps": n,
                                                      "agreeing": n}]}}
    s = status.status(trace, replayed)
    assert s.kind == "replayed"
    assert s.text.startswith("vLLM does at these steps what the model says: confirmed on vLLM 0.30.0")
