"""Labels per counterexample follow the affected-release matrix, and say what a confirmation ran."""

from __future__ import annotations

from pathlib import Path

from contract.evidence import matrix, status
from contract.scenario import Runner
from contract.trace import load

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = matrix.load_conformance(ROOT / "reports" / "conformance")


def label(policy: str, prop: str, conformance=CONFORMANCE) -> status.Status:
    return status.status(load(ROOT / "reports" / policy / f"{prop}.json"), conformance)


def test_the_bug_56312_fixed_is_a_known_positive_control():
    s = label("vllm_0_29", "P3")
    assert s.kind == "known, fixed upstream"
    assert "#56312" in s.text and "on vLLM 0.29.0's code on CPU, CUDA graphs simulated" in s.text


def test_a_counterexample_no_release_fixes_is_new():
    s = label("vllm_0_30", "P1")
    assert s.kind == "new"
    assert "mirrored from vLLM 0.30.0" in s.text and "stand-in" in s.text  # EAGLE drafter, no draft model


def test_unreplayed_and_unreleased_are_reading():
    assert label("mrv2_0_34", "P1").kind == "reading"
    draft = label("pr56312_draft", "P1")
    assert draft.kind == "reading" and "models no released vLLM" in draft.text


def test_a_refuting_replay_takes_the_label_back():
    p3 = load(ROOT / "reports" / "vllm_0_29" / "P3.json")
    refuted = {("0.29.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed", "steps": 3, "agreeing": 2}]}}
    assert status.status(p3, refuted).kind == "reading"
    still = {**CONFORMANCE, ("0.30.0", Runner.MRV1): {"traces": [{"name": p3.name, "status": "replayed",
                                                                  "steps": 3, "agreeing": 1}]}}
    assert status.status(p3, still).kind == "new"  # no later release replayed as fixed
