"""The affected-release matrix: for one counterexample, each vLLM release from 0.28.0 to 0.34.0 and
each runner, what the real-code replay on that release showed.

A cell is read from ``reports/conformance/vllm-<release>.json`` (written by ``cudagraph-contract
conform`` in that release's environment) and the model's prediction under the policy that models
the release:

- **affected**: replayed, vLLM's steps equal the model's, and the model reports the violation;
- **fixed**: replayed, the steps agree, and the property holds on that release;
- **refuted**: replayed, and vLLM's steps differ from the model's;
- **not applicable**: the release has no such runner (MRV1 was removed in 0.34.0), or the trace's
  start-up order cannot happen on it;
- **not run**: no replay on that release yet; the cell names the model's prediction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from contract.real.compare import predict
from contract.families import load_policy
from contract.core.scenario import Runner
from contract.core.trace import Trace, TraceError

RELEASES: tuple[str, ...] = ("0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")

AFFECTED, FIXED, REFUTED, NOT_APPLICABLE, NOT_RUN = "affected", "fixed", "refuted", "not applicable", "not run"


def release_policy(release: str, runner: Runner) -> str | None:
    """The built-in policy modelling ``runner`` in ``release``; None where the release lacks it or
    no policy models it.

    MRV1: #56312 first shipped in 0.30.0 (``vllm_0_30``); 0.28.0 and 0.29.0 carry the byte-identical
    pre-#56312 wrapper (``vllm_0_29``); 0.34.0 has no ``v1/worker/gpu_model_runner.py``.
    MRV2: ``mrv2_0_33`` and ``mrv2_0_34`` model ``v1/worker/gpu/`` of those releases.
    """
    minor = int(release.split(".")[1])
    if runner is Runner.MRV1:
        if minor >= 34:
            return None
        return "vllm_0_30" if minor >= 30 else "vllm_0_29"
    return {33: "mrv2_0_33", 34: "mrv2_0_34"}.get(minor)


@dataclass(frozen=True)
class Cell:
    release: str
    state: str
    detail: str = ""


def load_conformance(directory: Path) -> dict[tuple[str, Runner], dict]:
    """(release, runner) -> that replay's conformance JSON (``vllm-X.json`` for MRV1, ``vllm-X-mrv2.json``
    for MRV2, told apart by ``load_model_block.runner``); unreadable files are skipped."""
    out: dict[tuple[str, Runner], dict] = {}
    for path in sorted(Path(directory).glob("vllm-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and isinstance(data.get("vllm"), str):
            runner = (data.get("load_model_block") or {}).get("runner") or "MRV1"
            out[(data["vllm"], Runner(runner))] = data
    return out


def violates(trace: Trace, policy_name: str) -> bool | None:
    """Whether the model reports ``trace.property`` under ``policy_name`` (for a trace with no
    property, a *halt* class's witness: whether vLLM stops at its last step); None when the trace's
    start-up order cannot happen under it."""
    try:
        steps, violations, _ = predict(trace, load_policy(policy_name))
    except TraceError:
        return None
    if trace.property is None:
        return len(steps) == len(trace.events) and bool(steps) and "halted" in steps[-1]
    return any(v["property"] == trace.property for v in violations)


def cell(trace: Trace, release: str, conformance: dict[tuple[str, Runner], dict]) -> Cell:
    policy = release_policy(release, trace.scenario.runner)
    if policy is None:
        why = ("MRV1 was removed in 0.34.0" if trace.scenario.runner is Runner.MRV1
               else "no MRV2 policy models this release")
        return Cell(release, NOT_APPLICABLE if trace.scenario.runner is Runner.MRV1 else NOT_RUN, why)
    predicted = violates(trace, policy)
    if predicted is None:
        return Cell(release, NOT_APPLICABLE, f"its start-up order cannot happen under {policy}")
    data = conformance.get((release, trace.scenario.runner))
    result = None
    if data is not None:
        result = next((t for t in data.get("traces", []) if t.get("name") == trace.name), None)
    if result is None or result.get("status") != "replayed":
        why = result.get("status") if result else "no replay on this release"
        return Cell(release, NOT_RUN, f"{why}; the model predicts {'affected' if predicted else 'fixed'}")
    if result.get("agreeing") != result.get("steps") or result.get("disagreements"):
        return Cell(release, REFUTED, f"{result.get('agreeing')} of {result.get('steps')} steps agree")
    return Cell(release, AFFECTED if predicted else FIXED, f"{result['steps']} of {result['steps']} steps agree")


def row(trace: Trace, conformance: dict[tuple[str, Runner], dict]) -> list[Cell]:
    return [cell(trace, release, conformance) for release in RELEASES]


def markdown(trace: Trace, conformance: dict[tuple[str, Runner], dict]) -> list[str]:
    """The matrix as a short list, one line per release (readable on GitHub at any width)."""
    lines = [f"{trace.scenario.runner.value}, each release replayed on its own code (CPU, CUDA graphs simulated) "
             "unless marked otherwise:", ""]
    for c in row(trace, conformance):
        lines.append(f"- vLLM {c.release}: **{c.state}**" + (f" ({c.detail})" if c.detail else ""))
    return lines


def witness_release(trace: Trace, conformance: dict[tuple[str, Runner], dict]) -> str:
    """The release a page shows the reproduction on: the first its policy models where the replay
    confirmed it, else the first where the replay confirmed it, else the first its policy models,
    else the newest."""
    cells = row(trace, conformance)
    affected = [c.release for c in cells if c.state == AFFECTED]
    modelled = [r for r in RELEASES if release_policy(r, trace.scenario.runner) == trace.policy]
    return ([r for r in affected if r in modelled] or affected or modelled or [RELEASES[-1]])[0]


def replay_release(trace: Trace) -> str:
    """The release to replay a trace on: the first its policy models, else the first release of its
    runner the project replays (an unreleased MRV1 revision such as #56312's draft starts from 0.30.0)."""
    modelled = [r for r in RELEASES if release_policy(r, trace.scenario.runner) == trace.policy]
    return modelled[0] if modelled else ("0.30.0" if trace.scenario.runner is Runner.MRV1 else "0.34.0")


def outcomes(trace: Trace, conformance: dict[tuple[str, Runner], dict]) -> str:
    """Where a test of the trace's property fails and passes, as replayed."""
    cells = row(trace, conformance)
    fails = [c.release for c in cells if c.state == AFFECTED]
    passes = [c.release for c in cells if c.state == FIXED]
    parts = [f"fails on vLLM {', '.join(fails)}" if fails else "fails on no replayed release",
             f"passes on vLLM {', '.join(passes)}" if passes else "no replayed release passes it yet"]
    return "; ".join(parts)
