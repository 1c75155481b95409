"""Graph coverage: how many serving dispatches a CUDA graph serves, on one fixed serving script.

A violation class says what goes wrong; it cannot say that a branch removed a rule that *made*
graphs (vLLM 0.33.0 with resolve's FULL → FULL_AND_PIECEWISE upgrade removed sends every mixed
batch eagerly under FULL_DECODE_ONLY: fewer P1 classes, fewer graphs). So each scenario is run
on the same script (``script``: start-up, then ``execute_model`` for every token count, uniform
or not, and ``propose`` for every token count with a drafter that has a model; the conformance
corpus replays exactly this script on vLLM's code), and every serving dispatch (``execute_model``
and ``propose``; not ``force_eager``, which asks for eager) is counted per **dispatch kind**:

- ``target mixed``: an ``execute_model`` batch that is not uniform decode;
- ``target uniform decode``: ``execute_model(uniform_decode)``;
- ``draft prefill``: a drafter's first forward of a ``propose`` (MRV1's only one);
- ``draft decode``: MRV2's one-token draft steps (``propose_decode``).

A dispatch is **served** when a capturing layer captured or replayed it and nothing raised.
Model and real observations are counted alike, from ``StepRecord``s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.core.events import (
    CaptureModel,
    ExecuteModel,
    LoadModel,
    Peer,
    ProfileCudagraphMemory,
    ProfileRun,
    Propose,
    Resolve,
    batch_requests,
)
from contract.core.modes import NONE
from contract.core.observation import Action, Dispatch, StepRecord
from contract.core.scenario import MAX_NUM_SEQS, NUM_TOKENS_DOMAIN, DrafterKind, Scenario

FORCE_EAGER_AT = 2
KINDS = ("target mixed", "target uniform decode", "draft prefill", "draft decode")
ROLE = {"target mixed": "target", "target uniform decode": "target", "draft prefill": "drafter",
        "draft decode": "drafter"}


def script(scenario: Scenario) -> list:
    """The fixed event script: start-up in the worker's order, then every serving batch; on several
    DP ranks each batch beside the peers of ``peer_sets``; with LoRA each batch also with every
    count of active adapters it can have."""
    q = scenario.uniform_decode_query_len
    events: list = [LoadModel(), ProfileRun(), ProfileCudagraphMemory(), Resolve(), CaptureModel()]
    for n in NUM_TOKENS_DOMAIN:
        for uniform in (False, True) if n % q == 0 else (False,):
            for peers in peer_sets(scenario.data_parallel_size, n, uniform, scenario.ubatching):
                events.append(ExecuteModel(n, uniform, peers=peers))
            # with LoRA, again for each count of active adapters the batch's requests can ask for
            requests = batch_requests(ExecuteModel(n, uniform), q, MAX_NUM_SEQS)
            events += [ExecuteModel(n, uniform, num_active_loras=k)
                       for k in range(1, min(scenario.max_loras, requests) + 1)]
            if n == FORCE_EAGER_AT:
                events.append(ExecuteModel(n, uniform, force_eager=True, peers=(Peer(0),) * (scenario.data_parallel_size - 1)))
    if scenario.drafter is DrafterKind.WITH_MODEL and scenario.data_parallel_size == 1:
        events.extend(Propose(n) for n in NUM_TOKENS_DOMAIN)
    return events


def peer_sets(data_parallel_size: int, n: int, uniform: bool = False, micro_batched: bool = False
              ) -> list[tuple[Peer, ...]]:
    """The other ranks beside a batch of ``n`` tokens: none on one rank; else every other rank idle,
    every other rank with a mixed batch of the next token count (the ranks pad to the larger), and
    the last rank needing eager (``need_eager``) at ``FORCE_EAGER_AT``. Under micro-batching every
    other rank also brings the same batch: the decode threshold holds only where every rank runs a
    uniform decode, and a mixed step splits only where the smallest rank reaches the prefill one."""
    k = data_parallel_size - 1
    if not k:
        return [()]
    out = [(Peer(0),) * k, (Peer(n % NUM_TOKENS_DOMAIN[-1] + 1),) * k]
    if micro_batched:
        out.append((Peer(n, uniform),) * k)
    if n == FORCE_EAGER_AT:
        out.append((Peer(0),) * (k - 1) + (Peer(n, force_eager=True),))
    return out


def dispatch_kind(event, d: Dispatch) -> str | None:
    """The kind of a serving dispatch; None for start-up and ``force_eager`` target dispatches. On
    several MRV1 ranks the draft passes are part of the ``execute_model`` step."""
    if d.role == "drafter" and (isinstance(event, Propose) or d.context in ("propose", "propose_decode")):
        return "draft decode" if d.context == "propose_decode" else "draft prefill"
    if isinstance(event, ExecuteModel):
        if event.force_eager or d.role != "target":
            return None
        return "target uniform decode" if event.uniform_decode else "target mixed"
    return None


def wanted(kind: str, scenario: Scenario) -> bool:
    """Whether the configuration wants dispatches of ``kind`` served by a graph: not the drafter's
    under ``speculative_config.enforce_eager``, which asks for an eager drafter (P8's intent,
    ``contract/core/properties.py``); a branch that stops graphing them loses nothing."""
    return not (scenario.spec_enforce_eager and ROLE[kind] == "drafter")


def served(d: Dispatch) -> bool:
    """A capturing layer captured or replayed the dispatch, and nothing raised."""
    return (d.runtime_mode != NONE and not d.error
            and any(a.action in (Action.CAPTURED, Action.REPLAYED) for a in d.acting)
            and not any(a.action is Action.RAISED for a in d.acting))


@dataclass(frozen=True)
class Coverage:
    """Per dispatch kind, the serving dispatches made and those a graph served."""

    total: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)

    @property
    def dispatches(self) -> int:
        return sum(self.total.values())

    @property
    def graphs(self) -> int:
        return sum(self.served.values())

    @property
    def share(self) -> float | None:
        return self.graphs / self.dispatches if self.dispatches else None

    def kinds(self) -> dict[str, tuple[int, int]]:
        """kind -> (served, total), for the kinds the script made."""
        return {k: (self.served.get(k, 0), self.total[k]) for k in KINDS if k in self.total}

    def text(self) -> str:
        if not self.dispatches:
            return "no serving dispatch (vLLM stopped before serving)"
        kinds = ", ".join(f"{k} {s}/{t}" for k, (s, t) in self.kinds().items())
        return f"{self.graphs} of {self.dispatches} serving dispatches served by a graph ({kinds})"

    def to_json(self) -> dict:
        return {"served": self.graphs, "dispatches": self.dispatches,
                "kinds": {k: {"served": s, "dispatches": t} for k, (s, t) in self.kinds().items()}}


def coverage(records: list[StepRecord]) -> Coverage:
    total: dict[str, int] = {}
    graphs: dict[str, int] = {}
    for r in records:
        for d in r.dispatches:
            k = dispatch_kind(r.event, d)
            if k is None:
                continue
            total[k] = total.get(k, 0) + 1
            graphs[k] = graphs.get(k, 0) + served(d)
    return Coverage(total, graphs)


def lost_kinds(base: Coverage, branch: Coverage) -> list[str]:
    """The kinds a branch serves fewer dispatches of with a graph than its base does."""
    return [k for k in KINDS if branch.served.get(k, 0) < base.served.get(k, 0)]


def run_script(scenario: Scenario, policy) -> list[StepRecord]:
    """The model's records of ``script`` (events its runner takes, up to where it stops)."""
    from contract.core.engine import Run

    run = Run(scenario, policy)
    for event in script(scenario):
        if run.state.halted:
            break
        if run.can(event):
            run.apply(event)
    return run.records


def model_coverage(scenario: Scenario, policy) -> Coverage:
    return coverage(run_script(scenario, policy))


def affected_by_kind(records: list[StepRecord], scenario: Scenario, runner, sig) -> dict[str, tuple[int, int]]:
    """Per dispatch kind, how many of the script's serving dispatches show ``sig`` (a class's
    signature), of how many."""
    from contract.core.classes import signature
    from contract.core.properties import check

    out: dict[str, tuple[int, int]] = {}
    for r in records:
        # a violation of the whole step (P9's: no dispatch named) shows on each of the step's dispatches
        shown = {v.dispatch for v in check(r, scenario, runner) if signature(v, r) == sig}
        for i, d in enumerate(r.dispatches):
            kind = dispatch_kind(r.event, d)
            if kind is not None:
                hit, total = out.get(kind, (0, 0))
                out[kind] = (hit + (i in shown or None in shown), total + 1)
    return out


def affected_share(records: list[StepRecord], scenario: Scenario, runner, sig) -> float | None:
    """The share of the script's serving dispatches that show ``sig`` (a class's signature)."""
    counts = affected_by_kind(records, scenario, runner, sig).values()
    total = sum(t for _, t in counts)
    return sum(h for h, _ in counts) / total if total else None
