"""Violation classes: what a vLLM maintainer would call one bug.

A class is a *signature* — the property, the role (target or drafter), the runtime mode and what
happened — together with the smallest scenario settings under which it occurs. The explorer
records, for every signature, the shortest witness in every scenario class; the settings of a
class are the minimal deviations from vLLM's defaults among those scenarios, so one property
cell splits into the distinct causes behind it (for ``vllm_0_30`` P1: breakable with
micro-batching, compiled under FULL then upgraded, compilation off with attention in
``splitting_ops``).

A stop of vLLM is a P0 class (a crash after validation, ``contract/core/halts.py``) or an
accepted rejection: the latter is no class, and is enumerated apart (``rejection``) so a report
can list what vLLM refuses and why.

Every class has a **severity** (``Severity``), from what a user of vLLM would see, worst first:
a crash at start-up, a crash when serving, a wrong result, a FULL graph of a shape its attention
backend does not state it supports (result unverified), graph memory the KV cache sizing left out, a graph the configuration rules out, a graph captured at serving time, a silent eager fallback
(with the share of the scenario's serving dispatches it affects), a log line only. Classes are sorted by it everywhere they are listed.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from dataclasses import dataclass, field

from contract.core.events import describe_event, event_to_json
from contract.core.observation import Action, StepRecord
from contract.core.properties import (
    ATTENTION_IN_SEGMENT,
    DECODE_GRAPH_FOR_PREFILL,
    LORA_CASE,
    LORA_SELECTED,
    LORA_UNSELECTED,
    MAMBA_BLOCKS,
    PADDED_REQUESTS,
    UBATCH_MIXED,
    Violation,
)
from contract.core.scenario import DrafterKind, Scenario
from contract.core.sizes import DIFFERENT_MODES, DIFFERENT_TOKENS, RANK_HUNG

NO_CAPTURER = "no capturer"
NESTED = "nested capture"
WRONG_CAPTURER = "wrong capturer"
OUTSIDE_WINDOW = "capture outside the capture phase"  # vLLM's guard raises
OUTSIDE_WINDOW_SILENT = "capture outside the capture phase, not refused"
CROSS_MODE_REPLAY = "replay of an entry captured under another mode"
RECAPTURE = "re-capture of a captured entry"
NONE_CAPTURED = "NONE dispatch captured"
UNWRAP_STOPS = "unwrap stops at a wrapper"
STOPS = "vLLM stops"
MAX_ID = 180  # characters of a class id, a file name
STOPS_AT_START_UP = "vLLM stops at start-up"
STOPS_WHEN_SERVING = "vLLM stops when serving"
ILLEGAL_SHAPE = "FULL graph of a shape the attention backend cannot replay"
LORA_CASE_SHORT = "graph captured for fewer LoRA adapters than the batch has"
ATTENTION_CAPTURED = ATTENTION_IN_SEGMENT
BREAKABLE_PADDED = PADDED_REQUESTS
UNWANTED_GRAPH = "graph under speculative_config.enforce_eager"
GRAPH_UNDER_NONE = "graph under cudagraph_mode NONE"
GRAPH_IN_PROFILE_RUN = "graph in profile_run's eager pass"
MODE_NOT_CONFIGURED = "graph of a mode cudagraph_mode does not name"
UNACCOUNTED = "graphs memory profiling did not estimate"
OVER_ACCOUNTED = "graphs memory profiling estimated that capture_model does not capture"
WRONG_POOL = "capture into a pool its phase does not intend"
RANK_EAGER = "a rank that needs eager runs a graph"
DUMMY_UNALIGNED = "an idle rank's dummy batch is no uniform decode of q tokens"
HALT = "halt"
REJECTED = "rejected"  # an accepted rejection: not a class, listed apart
ACCEPTED = "accepted rejection"
# A differential's: the branch's accepted rejection at a step its base goes on from (a configuration
# the base starts that the branch refuses), a class where one release's rejection is none.
REFUSED = "refused"
NEWLY_REFUSED = "vLLM refuses at start-up what the base starts"


class Severity(enum.Enum):
    """How bad a class is for a user of vLLM, worst first (``rank``).

    P4's silent runtime capture and P5's re-capture rank between a wrong result and a silent eager
    fallback: a graph still serves the batch, but it is captured while serving, outside the memory
    profiling that sized the KV cache (a stall on the serving path and graph memory nobody
    reserved), so it is worse than running eagerly and better than replaying the wrong graph."""

    CRASH_START_UP = (0, "crash at start-up")
    # DP ranks that run different collectives or shapes wait on each other until a timeout: the
    # server stops answering without stopping.
    HANG = (1, "hang")
    CRASH_SERVING = (2, "crash when serving")
    WRONG_RESULT = (3, "wrong result")
    # A FULL graph for batches outside what the backend states it supports
    # (``AttentionCGSupport``'s docstrings, ``v1/attention/backend.py``): the backend says it does
    # not support the shape, not that the replay computes a wrong result, and no run checked it.
    UNSUPPORTED_SHAPE = (4, "unsupported shape, result unverified")
    # The KV cache is sized from an estimate that misses graphs capture_model then allocates: out of
    # memory at capture where the budget is tight (vLLM #49224), or memory reserved for nothing.
    MEMORY = (5, "memory")
    # A graph the user's configuration rules out: it serves unless it cannot be captured at all,
    # the reason such a setting exists (a drafter that must run eagerly), then vLLM stops.
    UNWANTED_GRAPH = (6, "graph the configuration rules out")
    RUNTIME_CAPTURE = (7, "graph captured at serving time")
    EAGER_FALLBACK = (8, "silent eager fallback")
    LOG_ONLY = (9, "log only")

    @property
    def rank(self) -> int:
        return self.value[0]

    @property
    def label(self) -> str:
        return self.value[1]


def severity(sig: "Signature", event_kind: str | None = None) -> Severity:
    """A signature's severity; ``event_kind``, the step it shows on, decides the phase of a nested
    capture (a CUDA error at capture time or when serving)."""
    from contract.core.halts import phase

    p, what = sig.property, sig.what
    if p == "P0":
        return Severity.CRASH_START_UP if what == STOPS_AT_START_UP else Severity.CRASH_SERVING
    if p == "P1" and what == NESTED:
        return Severity.CRASH_SERVING if event_kind and phase(event_kind) == "serving" else Severity.CRASH_START_UP
    if p == "P4" and what == OUTSIDE_WINDOW:  # the capture guard raises: P0 (serving) on the same step
        return Severity.CRASH_SERVING if not event_kind or phase(event_kind) == "serving" else Severity.CRASH_START_UP
    if p == "lost graphs":  # a differential's lost graphs: batches the base served run eagerly
        return Severity.EAGER_FALLBACK
    if p == REFUSED:  # the user's command no longer starts
        return Severity.CRASH_START_UP
    if p == "P7" and what == MAMBA_BLOCKS:  # the kernel's assertion, where the graph is captured
        return Severity.CRASH_SERVING if event_kind and phase(event_kind) == "serving" else Severity.CRASH_START_UP
    if p == "P7":
        return (Severity.WRONG_RESULT if what in (LORA_CASE_SHORT, LORA_UNSELECTED, ATTENTION_CAPTURED, UBATCH_MIXED,
                                                  DECODE_GRAPH_FOR_PREFILL)
                else Severity.UNSUPPORTED_SHAPE)
    if p == "P9":
        return Severity.EAGER_FALLBACK if what == DUMMY_UNALIGNED else Severity.HANG
    if p == "P5" and what == LORA_SELECTED:  # an illegal memory access at the first replay (vLLM #28334)
        return Severity.CRASH_START_UP
    if p == "P2" or (p == "P5" and what == CROSS_MODE_REPLAY):
        return Severity.WRONG_RESULT
    if p in ("P4", "P5"):
        return Severity.RUNTIME_CAPTURE
    if p == "P8":
        return Severity.UNWANTED_GRAPH
    if p == "P10":
        return Severity.MEMORY
    if p == "P1":
        return Severity.EAGER_FALLBACK
    return Severity.LOG_ONLY


@dataclass(frozen=True, order=True)
class Signature:
    property: str  # P0..P10, "lost graphs" and "refused" (a differential's), or "rejected" (an accepted rejection)
    role: str  # "target", "drafter" or "-"
    runtime_mode: str  # the dispatch's runtime_mode name, or "-"
    what: str  # one of the constants above
    detail: str = ""  # halts: vLLM's error, as the model states it

    def to_json(self) -> dict:
        out = {"property": self.property, "role": self.role, "runtime_mode": self.runtime_mode, "what": self.what}
        if self.detail:
            out["detail"] = self.detail
        return out


def _what(v: Violation, record: StepRecord) -> tuple[str, str, str]:
    """(role, runtime_mode, what) of a violation on its step."""
    d = record.dispatches[v.dispatch] if v.dispatch is not None else None
    if v.property == "P0":
        from contract.core.halts import phase

        what = STOPS_WHEN_SERVING if phase(record.event.kind) == "serving" else STOPS_AT_START_UP
        return (d.role, d.runtime_mode.name, what) if d is not None else ("-", "-", what)
    if v.property == "P6":
        role = "drafter" if "of the drafter" in v.message else "target"
        return role, "-", UNWRAP_STOPS
    if v.property == "P10":
        if d is None:
            return "-", "-", OVER_ACCOUNTED
        return d.role, d.runtime_mode.name, WRONG_POOL if " pool: " in v.message else UNACCOUNTED
    if v.property == "P9":
        first = v.message.split(";")[0]
        what = (DIFFERENT_MODES if "different runtime modes" in first else DIFFERENT_TOKENS if "token counts" in first
                else RANK_EAGER if "needs eager" in first else RANK_HUNG if "leaving the others waiting" in first
                else DUMMY_UNALIGNED)
        sides = record.ranks or record.stages
        return "target", "-" if what in (DIFFERENT_MODES, RANK_HUNG) else sides[0].runtime_mode.name, what
    if d is None:
        return "-", "-", v.property
    if v.property == "P1":
        return d.role, d.runtime_mode.name, NESTED if len(d.acting) > 1 else NO_CAPTURER
    if v.property == "P2":
        return d.role, d.runtime_mode.name, NONE_CAPTURED
    if v.property == "P3":
        return d.role, d.runtime_mode.name, WRONG_CAPTURER
    if v.property == "P4":
        raised = any(a.action is Action.RAISED for a in d.acting)
        return d.role, d.runtime_mode.name, OUTSIDE_WINDOW if raised else OUTSIDE_WINDOW_SILENT
    if v.property == "P5":
        replayed_elsewhere = any(a.action is Action.REPLAYED for a in d.acting)
        return d.role, d.runtime_mode.name, (LORA_SELECTED if LORA_SELECTED in v.message else CROSS_MODE_REPLAY
                                             if replayed_elsewhere else RECAPTURE)
    if v.property == "P7":
        what = (LORA_UNSELECTED if LORA_UNSELECTED in v.message
                else LORA_CASE_SHORT if LORA_CASE in v.message
                else ATTENTION_CAPTURED if ATTENTION_IN_SEGMENT in v.message
                else BREAKABLE_PADDED if PADDED_REQUESTS in v.message
                else MAMBA_BLOCKS if MAMBA_BLOCKS in v.message
                else UBATCH_MIXED if UBATCH_MIXED in v.message
                else DECODE_GRAPH_FOR_PREFILL if DECODE_GRAPH_FOR_PREFILL in v.message else ILLEGAL_SHAPE)
        return d.role, d.runtime_mode.name, what
    if v.property == "P8":
        what = (GRAPH_UNDER_NONE if "under cudagraph_mode NONE" in v.message
                else MODE_NOT_CONFIGURED if "does not name" in v.message
                else GRAPH_IN_PROFILE_RUN if " in profile_run" in v.message else UNWANTED_GRAPH)
        return d.role, d.runtime_mode.name, what
    return d.role, d.runtime_mode.name, v.property


def signature(v: Violation, record: StepRecord) -> Signature:
    role, mode, what = _what(v, record)
    detail = _halt_detail(record.halted) if v.property == "P0" and record.halted else ""
    return Signature(v.property, role, mode, what, detail)


def _halt_detail(text: str) -> str:
    # Numbers and sizes vary with the scenario; the kind of stop does not.
    return re.sub(r"\d+", "N", text.split("\n")[0])[:160]


def signatures(record: StepRecord, violations: list[Violation]) -> list[tuple[Signature, Violation | None]]:
    """Every class signature a step shows, in the order the step showed them. A stop is P0's
    (``properties.liveness``) or an accepted rejection (``rejection``), never a class of its own."""
    return [(signature(v, record), v) for v in violations]


def rejection(record: StepRecord) -> Signature | None:
    """An accepted rejection on this step (a ``ValueError`` with advice at start-up), as a signature
    for enumerating them; not a violation class."""
    from contract.core.halts import HaltKind, kind

    if record.halted and kind(record.halted) is HaltKind.REJECTED:
        return Signature(REJECTED, "-", "-", ACCEPTED, _halt_detail(record.halted))
    return None


# ---------------------------------------------------------------------------------------------
# Scenario settings, as deviations from vLLM's defaults

_LABELS = {
    "breakable": "breakable",
    "ubatching": "micro-batching",
    "cudagraph_mode": "cudagraph_mode",
    "compilation_mode": "compilation",
    "splitting_ops": "splitting_ops",
    "drafter": "drafter",
    "attention_support": "attention support",
    "spec_enforce_eager": "drafter enforce_eager",
    "uniform_decode_query_len": "uniform_decode_query_len",
    "varlen_decode_bound": "varlen bound declared",
    "attention_support_draft_only": "that support on the draft layers only",
}


def deviations(scenario: Scenario) -> dict[str, str]:
    """Fields that differ from ``Scenario()``; the runner is the policy's, not a setting, and a
    drafter's smallest query length (2) is its default."""
    default = Scenario()
    out = {}
    for f in dataclasses.fields(Scenario):
        if f.name == "runner":
            continue
        value, base = getattr(scenario, f.name), getattr(default, f.name)
        if f.name == "uniform_decode_query_len":
            base = 1 if scenario.drafter is DrafterKind.NONE else 2
        if value != base:
            out[f.name] = value.name if isinstance(value, enum.Enum) else str(value)
    return out


@dataclass(frozen=True, order=True)
class Setting:
    field: str
    values: tuple[str, ...]  # any of these

    def __str__(self) -> str:
        label = _LABELS.get(self.field, self.field)
        if self.values == ("True",):
            return f"{label} on"
        return f"{label} {' or '.join(self.values)}"

    def to_json(self) -> dict:
        return {"field": self.field, "values": list(self.values)}


def _order(field_name: str) -> int:
    names = [f.name for f in dataclasses.fields(Scenario)]
    return names.index(field_name) if field_name in names else len(names)


@dataclass(frozen=True)
class ViolationClass:
    signature: Signature
    settings: tuple[Setting, ...]  # empty: under vLLM's defaults
    witness: object = field(compare=False, hash=False)  # a Trace: the shortest counterexample
    step: int = field(default=0, compare=False)
    message: str = field(default="", compare=False)
    # silent eager fallback: the share of the witness scenario's serving dispatches (the fixed
    # serving script, ``contract/core/graphs.py``) that show this class; None where not measured
    affected: float | None = field(default=None, compare=False)

    @property
    def severity(self) -> Severity:
        events = getattr(self.witness, "events", ())
        return severity(self.signature, events[self.step].kind if self.step < len(events) else None)

    @property
    def severity_text(self) -> str:
        """The severity as a page states it: the share of serving dispatches for an eager fallback."""
        sev = self.severity
        if sev is Severity.EAGER_FALLBACK and self.affected is not None:
            return f"{sev.label} ({100 * self.affected:.0f}% of its scenario's serving dispatches)"
        return sev.label

    @property
    def key(self) -> tuple:
        return (self.signature, self.settings)

    @property
    def where(self) -> str:
        return " + ".join(str(s) for s in self.settings) or "vLLM's defaults"

    @property
    def title(self) -> str:
        s = self.signature
        head = s.property if s.role == "-" else f"{s.property} {s.role}" + ("" if s.runtime_mode == "-" else f" {s.runtime_mode}")
        what = s.what + (f" ({s.detail})" if s.detail else "")
        return f"{head}: {what}, under {self.where}"

    @property
    def id(self) -> str:
        """A file-name-safe name, stable across runs: ``P1-target-PIECEWISE-no-capturer--breakable+ubatching``."""
        s = self.signature
        parts = [s.property] + [x for x in (s.role, s.runtime_mode) if x != "-"] + [s.what]
        if s.detail:
            parts.append(s.detail)
        head = "-".join(parts)
        where = "+".join(st.field if st.values == ("True",) else f"{st.field}={'|'.join(st.values)}"
                         for st in self.settings) or "defaults"
        full = re.sub(r"[^A-Za-z0-9_=|+-]+", "-", f"{head}--{where}").replace("|", ",").strip("-")
        if len(full) <= MAX_ID:
            return full
        # Cut to fit a file name, and kept apart from every other class cut at the same place.
        return f"{full[:MAX_ID - 9]}-{hashlib.sha256(full.encode()).hexdigest()[:8]}"

    @property
    def length(self) -> int:
        return len(self.witness.events)

    @property
    def events_text(self) -> str:
        return " → ".join(describe_event(e) for e in self.witness.events)

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, **self.signature.to_json(), "severity": self.severity_text,
                "settings": [s.to_json() for s in self.settings],
                "witness": {"length": self.length, "step": self.step, "message": self.message,
                            "scenario": self.witness.scenario.to_json(),
                            "events": [event_to_json(e) for e in self.witness.events]}}


@dataclass(frozen=True)
class Occurrence:
    """The shortest witness of one signature in one scenario class."""

    scenario_index: int
    scenario: Scenario
    events: tuple
    step: int
    message: str


def _merge(groups: list[tuple[dict[str, frozenset], Occurrence]]) -> list[tuple[dict[str, frozenset], Occurrence]]:
    """Settings that differ in one field's value only are one cause: the values are joined."""
    changed = True
    while changed:
        changed = False
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                a, b = groups[i][0], groups[j][0]
                if a.keys() != b.keys():
                    continue
                differing = [k for k in a if a[k] != b[k]]
                if len(differing) == 1:
                    k = differing[0]
                    best = min(groups[i][1], groups[j][1], key=lambda o: (len(o.events), o.scenario_index))
                    groups[i] = ({**a, k: a[k] | b[k]}, best)
                    del groups[j]
                    changed = True
                    break
            if changed:
                break
    return groups


def by_severity(classes) -> list:
    """Worst first; within a severity, the order ``classes_from`` gives."""
    return sorted(classes, key=lambda c: c.severity.rank)


def classes_from(occurrences: dict[Signature, list[Occurrence]], make_trace, affected=None) -> list[ViolationClass]:
    """Minimal settings per signature, merged, each with its shortest witness, worst severity first.
    ``make_trace(occurrence, signature)`` records the witness as a trace; ``affected(occurrence,
    signature)``, when given, measures an eager fallback's share of serving dispatches."""
    out = []
    for sig, occs in occurrences.items():
        shortest: dict[frozenset, Occurrence] = {}
        for o in sorted(occs, key=lambda o: (len(o.events), o.scenario_index)):
            shortest.setdefault(frozenset(deviations(o.scenario).items()), o)
        devs = list(shortest.items())
        minimal = [(d, o) for d, o in devs if not any(other < d for other, _ in devs)]
        groups = [({k: frozenset({v}) for k, v in d}, o) for d, o in minimal]
        for settings, o in _merge(groups):
            ordered = tuple(Setting(k, tuple(sorted(settings[k]))) for k in sorted(settings, key=_order))
            share = affected(o, sig) if affected is not None and sig.property == "P1" and sig.what == NO_CAPTURER else None
            out.append(ViolationClass(sig, ordered, make_trace(o, sig), o.step, o.message, share))
    return sorted(out, key=lambda c: (c.severity.rank, c.signature, c.length, c.settings))


def of_records(records: list[StepRecord], scenario: Scenario, runner, check) -> list[tuple[Signature, int]]:
    """Signatures a replayed sequence shows, with the step of each (``check`` judges one record)."""
    out = []
    for r in records:
        for sig, _ in signatures(r, check(r, scenario, runner)):
            out.append((sig, r.index))
    return out


def of_trace(trace, policy) -> list[ViolationClass]:
    """The classes a single counterexample shows (one Hypothesis drew): its scenario's settings,
    not minimised across scenarios as the explorer's are."""
    from contract.core.properties import check
    from contract.core.trace import run_events

    run, _ = run_events(trace.scenario, policy, trace.events)
    settings = tuple(Setting(k, (v,)) for k, v in sorted(deviations(trace.scenario).items(), key=lambda kv: _order(kv[0])))
    out, seen = [], set()
    for r in run.records:
        for sig, v in signatures(r, check(r, trace.scenario, policy.runner)):
            if sig not in seen:
                seen.add(sig)
                out.append(ViolationClass(sig, settings, trace, r.index, v.message if v else ""))
    return by_severity(out)
