"""Versioned JSON traces: the one currency between Hypothesis, the explorer, regression cases, the
real-code replay and the reports.

Schema ``cudagraph-contract.trace`` version 1::

    {"schema": "cudagraph-contract.trace", "version": 1,
     "name": str, "policy": str (built-in name or .py path), "property": "P1".."P6" | null,
     "scenario": {Scenario fields by vLLM name; the MRV2-only speculator, model_compiled,
                  draft_compiled, adaptive_verification and extensible_kv_cache appear only when
                  not their default},
     "events": [{"event": "load_model"}, {"event": "execute_model", "num_tokens": 3, ...}, ...],
     "expected": {"violations": [{"property", "step", "message", "dispatch"?}],
                  "steps": [StepRecord.to_json(), ...]},
     "origin": {"engine": "hypothesis" | "explorer" | "regression", ...}}

Events may carry optional fields (``propose``'s ``uniform_decode``) written only when set, so
traces written before them read unchanged. Later versions add fields; readers reject versions they
do not know instead of guessing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from contract.core.events import Event, event_from_json, event_to_json, lora_problem, ranks_problem
from contract.core.output import one_line
from contract.core.policy import Policy
from contract.core.properties import PROPERTIES, Violation, check
from contract.core.engine import Run
from contract.core.scenario import MAX_NUM_SEQS, Scenario

SCHEMA = "cudagraph-contract.trace"
VERSION = 1


class TraceError(Exception):
    """A trace file that cannot be used; the message names the problem, in one line."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


@dataclass
class Trace:
    scenario: Scenario
    policy: str
    events: list[Event]
    name: str = ""
    property: str | None = None
    expected_violations: list[dict] = field(default_factory=list)
    expected_steps: list[dict] = field(default_factory=list)
    origin: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "name": self.name,
            "policy": self.policy,
            "property": self.property,
            "scenario": self.scenario.to_json(),
            "events": [event_to_json(e) for e in self.events],
            "expected": {"violations": self.expected_violations, "steps": self.expected_steps},
            "origin": self.origin,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n"


@dataclass
class Replay:
    records: list
    violations: list[Violation]
    mismatches: list[str]
    mismatched_steps: list[int] = field(default_factory=list)  # the steps whose observation differs

    @property
    def agrees(self) -> bool:
        return not self.mismatches


def run_events(scenario: Scenario, policy: Policy, events: list[Event], only=None) -> tuple[Run, list[Violation]]:
    run = Run(scenario, policy)
    violations: list[Violation] = []
    for i, event in enumerate(events):
        if not run.can(event):
            raise TraceError(f"event {i} ({event.kind}) cannot happen at that point of the start-up order")
        record = run.apply(event)
        violations.extend(check(record, scenario, policy.runner, only))
    return run, violations


def record(scenario: Scenario, policy: Policy, events: list[Event], *, name: str = "", prop: str | None = None,
           origin: dict | None = None) -> Trace:
    """Run events on the model and keep what it showed as the trace's expectation."""
    run, violations = run_events(scenario, policy, events)
    return _kept(run, violations, events, name, prop, origin)


def record_runnable(scenario: Scenario, policy: Policy, script: list[Event], *, name: str = "",
                    origin: dict | None = None) -> Trace:
    """The events of ``script`` the model's runner takes, up to where it halts, recorded as they run
    (one run of the model, where finding the events and then ``record`` would take two)."""
    run = Run(scenario, policy)
    taken: list[Event] = []
    violations: list[Violation] = []
    for event in script:
        if run.state.halted:
            break
        if run.can(event):
            violations.extend(check(run.apply(event), scenario, policy.runner))
            taken.append(event)
    return _kept(run, violations, taken, name, None, origin)


def _kept(run: Run, violations: list[Violation], events: list[Event], name: str, prop: str | None,
          origin: dict | None) -> Trace:
    scenario, policy = run.scenario, run.policy
    return Trace(
        scenario=scenario,
        policy=policy.name if policy.source == "built-in" else policy.source,
        events=list(events),
        name=name,
        property=prop,
        expected_violations=[v.to_json() for v in violations],
        expected_steps=[r.to_json() for r in run.records],
        origin=origin or {},
    )


def replay(trace: Trace, policy: Policy) -> Replay:
    """The trace's events run again under ``policy`` (``contract.families.for_trace`` says which
    policy a trace may run under), compared with what it recorded."""
    run, violations = run_events(trace.scenario, policy, trace.events)
    mismatches, steps = [], []
    for i, (want, r) in enumerate(zip(trace.expected_steps, run.records)):
        if want != r.to_json():
            steps.append(i)
            mismatches.append(f"step {i} ({trace.events[i].kind}) differs from the recorded observation")
    if [v.to_json() for v in violations] != trace.expected_violations:
        mismatches.append("the violations differ from the recorded ones")
    return Replay(run.records, violations, mismatches, steps)


def loads(text: str, source: str = "<trace>") -> Trace:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise TraceError(TOO_DEEP.format(source=source)) from None
    except ValueError as exc:  # a number past int's digit limit
        raise TraceError(f"{source} is not a usable trace: {str(exc).split(':')[0]}") from None
    if not isinstance(data, dict):
        raise TraceError(f"{source}: a trace is a JSON object")
    if _depth(data) > MAX_DEPTH:
        raise TraceError(TOO_DEEP.format(source=source))
    if data.get("schema") != SCHEMA:
        raise TraceError(f"{source}: not a {SCHEMA} file (schema={data.get('schema')!r})")
    if data.get("version") != VERSION:
        raise TraceError(f"{source}: trace version {data.get('version')!r} is not supported (this tool reads {VERSION})")
    for key in ("policy", "scenario", "events"):
        if key not in data:
            raise TraceError(f"{source}: missing field {key!r}")
    if not isinstance(data["events"], list):
        raise TraceError(f"{source}: 'events' must be a list")
    if not isinstance(data["policy"], str):
        raise TraceError(f"{source}: 'policy' must be a string: a built-in policy name or a .py path")
    try:
        scenario = Scenario.from_json(data["scenario"])
        events = [event_from_json(e) for e in data["events"]]
    except (ValueError, TypeError) as exc:
        raise TraceError(f"{source}: {exc}") from None
    problem = ranks_problem(events, scenario.data_parallel_size, scenario.micro_batched) or lora_problem(
        events, scenario.max_loras, scenario.uniform_decode_query_len, MAX_NUM_SEQS)
    if problem:
        raise TraceError(f"{source}: {problem}")
    prop = data.get("property")
    if prop is not None and (not isinstance(prop, str) or prop not in PROPERTIES):
        raise TraceError(f"{source}: unknown property {prop!r}; expected one of {', '.join(PROPERTIES)}")
    expected = data.get("expected") or {}
    if not isinstance(expected, dict):
        raise TraceError(f"{source}: 'expected' must be an object")
    for key in ("violations", "steps"):
        if not isinstance(expected.get(key) or [], list):
            raise TraceError(f"{source}: 'expected.{key}' must be a list")
    if not isinstance(data.get("origin") or {}, dict):
        raise TraceError(f"{source}: 'origin' must be an object")
    return Trace(
        scenario=scenario,
        policy=data["policy"],
        events=events,
        name=str(data.get("name", "")),
        property=prop,
        expected_violations=list(expected.get("violations") or []),
        expected_steps=list(expected.get("steps") or []),
        origin=dict(data.get("origin") or {}),
    )


MAX_TRACE_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 16  # traces written by this tool nest 8 levels (expected.steps[i].dispatches[j]...)
TOO_DEEP = "{source}: JSON nested more than %d levels deep; a trace nests 8" % MAX_DEPTH


def _depth(value) -> int:
    """How deep JSON containers nest, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:
                stack.extend((child, level + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def load(path: str | os.PathLike) -> Trace:
    p = Path(path)
    try:
        if p.is_dir():
            raise TraceError(f"trace file {p} is a folder; pass a trace .json file")
        if not p.exists():
            raise TraceError(f"trace file {p} does not exist")
        if not p.is_file():
            raise TraceError(f"trace file {p} is not a regular file; pass a trace .json file")
        if p.stat().st_size > MAX_TRACE_BYTES:
            raise TraceError(f"trace file {p} is larger than {MAX_TRACE_BYTES // 1024 // 1024} MiB; "
                             "a trace is a few KiB")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"trace file {p} is not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # unreadable, a name too long, a NUL byte
        raise TraceError(f"trace file {p} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    return loads(text, str(p))
