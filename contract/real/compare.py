"""The model's prediction and vLLM's observation of one trace, step by step.

The prediction is the model run under the policy that models the installed release, whatever
policy the trace was recorded under: the question is what *this* vLLM does with the trace's
scenario and events. A step agrees when the two ``StepRecord.to_json`` forms are equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest

from contract.core.events import describe_event
from contract.core.policy import Policy
from contract.core.properties import check
from contract.core.engine import Run
from contract.core.scenario import Runner
from contract.core.trace import Trace, TraceError

NOT_REPLAYED_MRV2 = "not replayed (MRV2)"
NOT_REPLAYED_MRV1 = "not replayed (MRV1)"
NOT_REPLAYED_ORDER = "not replayed (its start-up order cannot happen under {policy})"


@dataclass
class StepDiff:
    index: int
    event: str
    model: dict | None  # None: the model stopped before this step
    real: dict | None  # None: vLLM stopped before this step


@dataclass
class TraceResult:
    name: str
    source: str
    trace_policy: str
    status: str  # "replayed", NOT_REPLAYED_MRV2 or NOT_REPLAYED_ORDER
    steps: int = 0
    agreeing: int = 0
    diffs: list[StepDiff] = field(default_factory=list)
    model_steps: list[dict] = field(default_factory=list)
    real_steps: list[dict] = field(default_factory=list)
    violations: list[dict] = field(default_factory=list)  # the model's, under the compared policy
    note: str = ""
    path: list[dict] = field(default_factory=list)  # decision points per step (``decisions.Log.path``)
    # [sides, agreeing]: one side per DP rank (``ranks``) or PP stage (``stages``) per serving step,
    # model or vLLM, and those whose side is the same in both
    ranks: list[int] = field(default_factory=lambda: [0, 0])
    stages: list[int] = field(default_factory=lambda: [0, 0])

    @property
    def agrees(self) -> bool:
        return not self.diffs

    def to_json(self) -> dict:
        out = {"name": self.name, "source": self.source, "trace_policy": self.trace_policy,
               "status": self.status, "steps": self.steps, "agreeing": self.agreeing}
        if self.note:
            out["note"] = self.note
        if self.path:
            out["decision_path"] = self.path
        if self.diffs:
            out["disagreements"] = [
                {"step": d.index, "event": d.event, "model": d.model, "vllm": d.real} for d in self.diffs
            ]
        return out


def predict(trace: Trace, policy: Policy) -> tuple[list[dict], list[dict], str]:
    """The model's steps and violations; events after the step where the model halts are not run."""
    run = Run(trace.scenario, policy)
    steps: list[dict] = []
    violations: list[dict] = []
    for i, event in enumerate(trace.events):
        if not run.can(event):
            if run.state.halted:
                return steps, violations, f"{policy.name} halts at step {i - 1}; events from step {i} on are not run"
            raise TraceError(f"event {i} ({event.kind}) cannot happen at that point of the start-up order")
        record = run.apply(event)
        steps.append(record.to_json())
        violations.extend(v.to_json() for v in check(record, trace.scenario, policy.runner))
    return steps, violations, ""


def compare(session, trace: Trace, policy: Policy, source: str, runner: Runner = Runner.MRV1) -> TraceResult:
    """``session`` replays traces of ``runner`` (``replay.Session``: MRV1, ``mrv2.replay.Session``: MRV2)."""
    result = TraceResult(trace.name or source, source, trace.policy, "replayed")
    if trace.scenario.runner is not runner:
        result.status = NOT_REPLAYED_MRV2 if runner is Runner.MRV1 else NOT_REPLAYED_MRV1
        return result
    try:
        predicted, result.violations, result.note = predict(trace, policy)
    except TraceError as exc:
        if trace.policy == policy.name:
            raise
        # Recorded under another policy whose config-time normalisation enables other start-up
        # steps (e.g. profile_cudagraph_memory needs a mode other than NONE): not this release's run.
        result.status, result.note = NOT_REPLAYED_ORDER.format(policy=policy.name), str(exc)
        return result
    observed = session.replay(trace.scenario, trace.events[: len(predicted)])
    result.model_steps, result.real_steps = predicted, observed
    log = getattr(session, "decisions", None)  # the MRV1 replay logs its decision points
    if log is not None:
        result.path = list(log.path)
    for i, (want, got) in enumerate(zip_longest(predicted, observed)):
        result.steps += 1
        for key, counts in (("ranks", result.ranks), ("stages", result.stages)):
            mine, theirs = (want or {}).get(key, []), (got or {}).get(key, [])
            counts[0] += max(len(mine), len(theirs))
            counts[1] += sum(a == b for a, b in zip(mine, theirs))
        if want == got:
            result.agreeing += 1
        else:
            result.diffs.append(StepDiff(i, describe_event(trace.events[i]), want, got))
    return result
